"""The decision core: pure functions and values, no I/O, no clock reads.

``statemachine`` (phases and transitions), ``planner`` (snapshot -> plan), ``model`` (the
planner's inputs and outputs), ``policy`` (the annotations), ``decode`` (API objects -> views),
``gangstate`` (the GangState status codec), ``transform`` and ``admission`` (what the webhook
and ``kubectl jobset-inplace enable`` do to a JobSet). The adapters in
:mod:`jobset_inplace.controller` load snapshots and carry out plans."""
