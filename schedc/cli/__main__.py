"""`python -m schedc.cli ...`: the command line, as the `schedc` script runs it."""
from . import main

main()
