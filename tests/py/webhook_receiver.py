"""A Standard Webhooks receiver for the push consumer tests.

Verifies every delivery with the `standardwebhooks` package (the reference
library), answers 500 to the first FAIL_FIRST requests (every one when it
is -1) and 200 after, and prints one JSON line per request: whether the
signature verified, the status it answered, the event's group_id and seq,
and the webhook-id. Usage: webhook_receiver.py PORT SECRET FAIL_FIRST
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

port, secret, fail_first = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
webhook = Webhook(secret)
lock = threading.Lock()
seen = 0


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        global seen
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            webhook.verify(body, headers)
            verified = True
        except Exception:
            verified = False
        with lock:
            seen += 1
            ok = fail_first >= 0 and seen > fail_first
            event = json.loads(body)
            line = {
                "verified": verified,
                "status": 200 if ok else 500,
                "group_id": event["group_id"],
                "seq": event["seq"],
                "id": headers.get("webhook-id"),
            }
            print(json.dumps(line), flush=True)
        self.send_response(200 if ok else 500)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
print("listening", flush=True)
server.serve_forever()
