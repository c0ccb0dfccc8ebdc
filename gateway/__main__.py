"""`python -m gateway` is the same as the `switchyard` console script."""

from gateway.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
