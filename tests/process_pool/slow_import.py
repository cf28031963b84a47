"""A module that takes 0.6 s to import: preloaded, it makes a child's start-up slow on purpose."""

from __future__ import annotations

import time

time.sleep(0.6)
