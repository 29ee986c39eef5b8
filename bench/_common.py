"""What several benchmark scripts share (they run as scripts, bench/ first on sys.path: ``from _common import``)."""

import argparse


def peer_options(doc, reps, sweep=False):
    """The command line of a benchmark against numpy and pytensor peers, parsed: ``--reps R`` (timed calls per
    row, default ``reps``), ``--mode M`` (the PyTensor mode of ptnative and of the pytensor peers, default
    None: PyTensor's default) and, with ``sweep``, ``--no-sweep`` (only the main shape, not those around it).  ``doc``, the
    script's docstring, is its ``--help``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=reps)
    if sweep:
        parser.add_argument("--no-sweep", dest="sweep", action="store_false", help="only the main shape")
    parser.add_argument("--mode", default=None, help="PyTensor mode for ptnative and the pytensor peers "
                        "(default: PyTensor's default, Numba; try C)")
    return parser.parse_args()


def quick_options(doc):
    """The command line of a benchmark with one switch, ``--quick`` (small shapes, few calls), parsed; ``doc``, the
    script's docstring, is its ``--help``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes, few calls")
    return parser.parse_args()


def load_average():
    """The 1-minute load average (other processes' share of the cores: quote it with every figure)."""
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "unknown"
