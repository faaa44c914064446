"""Train the Eagle head: the same as ``banditspec build eagle`` (see README.md beside this file).

    .venv/bin/python engine_build/eagle/build_eagle.py [--epochs 3 --seed 0 ...]
"""

import sys

from banditspec_train.eagle.train import main

if __name__ == "__main__":
    sys.exit(main())
