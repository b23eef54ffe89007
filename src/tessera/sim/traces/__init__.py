"""Input file formats: the openb node and pod lists (``openb``) and the CSV reading every loader shares (``tables``)."""
