"""The PySpark data source and example pipeline. May import everything."""
