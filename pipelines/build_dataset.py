"""Build the HDF5 family store (same flags as `protdp data build`), e.g.

    python pipelines/build_dataset.py --pairs ../shared/data/PAIRS.tsv --out out/data.h5 --workers 2
"""

import sys

from protdp.cli import main

if __name__ == "__main__":
    sys.exit(main(["data", "build", *sys.argv[1:]]))
