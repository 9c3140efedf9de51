"""`python -m mgpu_lib ...`: the command line (`mgpu_lib.book.cli`)."""
from mgpu_lib.book.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
