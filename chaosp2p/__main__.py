"""``python -m chaosp2p`` runs the command line."""

from chaosp2p.cli import main

main()
