#!/bin/sh
# A worker container as an SSH node: a host key of its own (made now, never baked into the image), the
# controller's public key (ABLATE_SSH_AUTHORIZED_KEY, or PUBLIC_KEY as RunPod sets it), sshd in the
# foreground. Bootstrap does the rest over SSH (docs/operations.md).
set -eu
ssh-keygen -A >/dev/null
mkdir -p /root/.ssh /run/sshd
chmod 700 /root/.ssh
touch /root/.ssh/authorized_keys
chmod 600 /root/.ssh/authorized_keys
for key in "${ABLATE_SSH_AUTHORIZED_KEY:-}" "${PUBLIC_KEY:-}"; do
    if [ -n "$key" ] && ! grep -qxF "$key" /root/.ssh/authorized_keys; then
        printf '%s\n' "$key" >> /root/.ssh/authorized_keys
    fi
done
exec /usr/sbin/sshd -D -e -p "${SSH_PORT:-22}" \
    -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o PermitRootLogin=prohibit-password
