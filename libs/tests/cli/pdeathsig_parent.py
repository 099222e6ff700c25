"""Test helper: spawns a long-sleeping child through ProcessGroup, prints its pid, then waits forever.

The test SIGKILLs this parent (so no cleanup code runs) and checks the child dies anyway.
"""

from __future__ import annotations

import sys
import time

from llmfleet.supervisor import ProcessGroup

group = ProcessGroup()
child = group.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
