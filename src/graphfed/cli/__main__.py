"""``python -m graphfed.cli``: how ``graphfed bench`` starts each cell's own process."""

from graphfed.cli import main

main()
