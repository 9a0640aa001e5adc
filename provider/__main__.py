"""The component provider's entry point: the engine runs `python <this directory> <engine address>`."""

import sys
from pathlib import Path

# The library is the repository this directory sits in (requirements.txt installs it into the plugin's
# virtualenv too; the path makes a checkout run as it is).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.provider import serve  # noqa: E402

serve()
