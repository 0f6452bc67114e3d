"""The `gregor` command line."""
