"""A command arm's code archive onto a joined node, over SFTP on the node's pinned SSH connection (the one
its agent's channel runs on: no second login, the same known host key).

The archive lands as `{remote_dir}/code/<sha256>.tar`, written under a temporary name and renamed, so a
file with that name is a whole upload; one already there with the right size is reused (the second arm
of a grid, a resumed run). The node may tamper with it: the worker checks the hash before unpacking, and
what the node does with its own copy harms only the node. Nothing else goes this way.
"""

from __future__ import annotations

import io
import posixpath
from typing import TYPE_CHECKING

from orchestrator.fleet.shell import SFTP_TIMEOUT_S

if TYPE_CHECKING:
    import paramiko

CODE_DIR = "code"


def upload_archive(client: paramiko.SSHClient, remote_dir: str, name: str, data: bytes) -> str:
    """The absolute path of archive `name` on the node, uploaded unless a whole copy is there already."""
    sftp = client.open_sftp()
    try:
        sftp.get_channel().settimeout(SFTP_TIMEOUT_S)
        folder = posixpath.join(sftp.normalize(remote_dir), CODE_DIR)
        try:
            sftp.mkdir(folder, 0o700)
        except OSError:  # there already (an SFTP server says only "failure")
            pass
        target = posixpath.join(folder, name)
        try:
            if sftp.stat(target).st_size == len(data):
                return target
        except FileNotFoundError:
            pass
        partial = target + ".partial"
        sftp.putfo(io.BytesIO(data), partial, file_size=len(data), confirm=True)
        sftp.posix_rename(partial, target)
        return target
    finally:
        sftp.close()
