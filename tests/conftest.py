import os
from pathlib import Path

pytest_plugins = ["fixtures.services"]

# podman on these VMs needs the repository's settings (the VM refuses raising hard rlimits, crun fails
# on its cgroup layout); the scripts set CONTAINERS_CONF the same way (scripts/build-images.sh).
os.environ.setdefault(
    "CONTAINERS_CONF", str(Path(__file__).resolve().parents[1] / "scripts" / "podman-containers.conf")
)
