"""The ``engine-advisor`` command line: one entry point dispatching to each package's commands."""
