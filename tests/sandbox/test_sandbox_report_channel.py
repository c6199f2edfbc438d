"""The judge's report channel: the tested process can write to it, never take back what was written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from gagar.sandbox.pristine import open_channels

# run in the test process, which holds the write end: every way back into the report
THIEF = textwrap.dedent(
    """
    import json, os, sys
    fd = int(sys.argv[1])
    os.write(fd, b"written by the plugin\\n")

    def attempt(how):
        try:
            if how == "reopen":  # a pipe's write end reopens for reading here
                return os.read(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK), 1 << 16).hex()
            if how == "read":
                os.set_blocking(fd, False)
                return os.read(fd, 1 << 16).hex()
            os.lseek(fd, 0, 0)
            return os.read(fd, 1 << 16).hex()
        except OSError as exc:
            return exc.errno

    print(json.dumps({how: attempt(how) for how in ("reopen", "read", "seek")}))
    """
)


def test_the_test_process_cannot_read_the_report_back() -> None:
    import errno

    channels = open_channels(1 << 20)
    try:
        fd = channels.report.write_fd
        proc = subprocess.run(
            [sys.executable, "-c", THIEF, str(fd)], pass_fds=(fd,), capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert got["reopen"] == errno.ENXIO  # nothing to open: the end is a socket
        assert got["read"] == ""  # reading its own end gives what the judge sent: nothing, at once
        assert got["seek"] == errno.ESPIPE
        assert channels.report.collect().read() == b"written by the plugin\n"  # the judge got it all
    finally:
        channels.close()
