"""The product in plain Python: records, lifecycle, labels, configuration and pickup rules."""
