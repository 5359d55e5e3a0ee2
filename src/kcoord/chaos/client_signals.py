"""The signals every chaos client process (member, producer, queue consumer) answers.

- **SIGTERM** asks for a clean stop: it sets the event ``install`` returns, which the client's
  loop watches. The event is set from a thread of its own, never in the handler: a handler
  runs in the main thread between two bytecodes, possibly while that thread holds the event's
  lock inside ``Event.wait``, and ``Event.set`` then waits for that lock forever (a producer
  pacing its sends with ``stopping.wait`` never stopped, and was killed after the stop timeout).
- **SIGUSR1** writes every thread's stack to stderr (``faulthandler``): what the runner asks a
  client that does not stop for, before it kills it.
"""

from __future__ import annotations

import faulthandler
import signal
import threading
from types import FrameType


def dump_stacks_on_sigusr1() -> None:
    """SIGUSR1 alone (a client with its own SIGTERM handling: aiokafka's, on its loop)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def install() -> threading.Event:
    """Install both handlers; the event SIGTERM sets."""
    dump_stacks_on_sigusr1()
    stopping = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=stopping.set, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    return stopping
