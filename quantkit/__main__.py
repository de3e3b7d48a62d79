"""``python -m quantkit`` (and ``torchrun --nproc-per-node N -m quantkit pack ...``): the ``quantkit`` command."""

from quantkit.cli import main

main()
