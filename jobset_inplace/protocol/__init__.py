"""What the agent and the controller say to each other (this project's API types): the agent's
typed report with its one codec and ordering rule (:mod:`.report`), the report channel's
request envelope (:mod:`.envelope`), and what agents read of the GangState status
(:mod:`.gangstate`). Names and environment variables are in :mod:`jobset_inplace.names`.
Standard library only."""
