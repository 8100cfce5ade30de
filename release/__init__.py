"""Release tooling of the repository (not installed): what `make release` builds."""
