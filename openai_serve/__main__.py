"""`python -m openai_serve`: the same as the `openai-serve` command."""

from openai_serve.cli import main

if __name__ == "__main__":
    main()
