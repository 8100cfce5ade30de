"""The plugin executable's entry point (PyInstaller runs this script: release/plugin.py)."""

from jobset_inplace.kubectl_plugin import main

raise SystemExit(main())
