"""Run the command line with ``python -m gpuplane``."""

from gpuplane.cli.app import main

main()
