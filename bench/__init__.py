"""Scale benchmark: hybrid recovery vs stock JobSet on the local cluster (``make bench``)."""
