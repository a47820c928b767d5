"""An SMTP server for the outbound tests (Debian's python3-aiosmtpd).

    python3 smtp_server.py PORT DIR

Listens on 127.0.0.1:PORT. Each message it takes is appended to DIR/messages (one line, its
Subject). While DIR/reply exists, the end of the data is answered with that file's text (an
SMTP reply such as "451 4.3.0 try later") and the message is not kept. While DIR/stall exists,
the message is kept and the reply to the end of the data held back for 30 seconds: a server
that took the message and stalls. DIR/ready is written once the server accepts connections.
"""

import asyncio
import email
import os
import sys
import threading

from aiosmtpd.controller import Controller


class Handler:
    def __init__(self, directory):
        self.directory = directory

    def path(self, name):
        return os.path.join(self.directory, name)

    async def handle_DATA(self, server, session, envelope):
        reply = self.path("reply")
        if os.path.exists(reply):
            with open(reply) as f:
                return f.read().strip()
        message = email.message_from_bytes(envelope.content)
        with open(self.path("messages"), "a") as f:
            f.write((message.get("Subject") or "") + "\n")
        if os.path.exists(self.path("stall")):
            await asyncio.sleep(30)
        return "250 2.0.0 Message accepted for delivery"


def main():
    port, directory = int(sys.argv[1]), sys.argv[2]
    controller = Controller(Handler(directory), hostname="127.0.0.1", port=port)
    controller.start()
    open(os.path.join(directory, "ready"), "w").close()
    threading.Event().wait()  # until the test kills the process


if __name__ == "__main__":
    main()
