"""Ctrl-C held back while a native extension loads.

IREE's compiler and runtime bindings build their Python types as they are imported; a
KeyboardInterrupt raised into that (Ctrl-C at the wrong moment) aborts the process with
a C++ traceback instead of ending the command. Their imports are short (a fraction of a
second, seconds on a cold disk), so a Ctrl-C that arrives during one is delivered just
after it.
"""

import importlib
import signal
import threading
from types import ModuleType


def import_holding_ctrl_c(name: str) -> ModuleType:
    """Import module `name`, delivering a Ctrl-C that arrives meanwhile only once it is
    loaded. Off the main thread (which never receives signals) a plain import."""
    if threading.current_thread() is not threading.main_thread():
        return importlib.import_module(name)
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        return importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # now to the handler that was there
