"""Where the local datasets come from (no torch): the file names the readers expect and
the messages that say what to download and where to put it, shared by the config
check (before the torch import) and the readers."""

from __future__ import annotations

from pathlib import Path
from typing import Final

CIFAR_TRAIN_FILES: Final = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE: Final = "test_batch.bin"
CIFAR_SUBDIR: Final = "cifar-10-batches-bin"
CIFAR_URL: Final = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR_ARCHIVE: Final = "cifar-10-binary.tar.gz"
#: What the ``text`` task reads.
TEXT_SOURCE: Final = "a local text file (UTF-8 or any bytes)"


def cifar_how_to_get(where: Path | str) -> str:
    """How to put the CIFAR-10 binary files at ``where``."""
    return (
        f'download the "CIFAR-10 binary version" ({CIFAR_ARCHIVE}) from {CIFAR_URL} and '
        f"extract it so that {where} contains {', '.join(CIFAR_TRAIN_FILES)} and "
        f"{CIFAR_TEST_FILE} (the archive's {CIFAR_SUBDIR}/ folder; its parent works too)"
    )
