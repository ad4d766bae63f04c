"""An agent worker for the consumer tests: it pulls from a consumer when
told, and acknowledges what it pulled only when told, so a test can kill
it with events handed out and unacknowledged.

Reads commands on stdin, one per line: `pull` prints the events of one
pull as a JSON array on one line; `ack` acknowledges the last pull and
prints Ferry's answer. Usage: consumer_agent.py FERRY_URL CONSUMER MAX
"""

import json
import sys
import urllib.request

url, name, most = sys.argv[1], sys.argv[2], int(sys.argv[3])
pulled = []


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


print("ready", flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "pull":
        pulled = call("GET", f"/v1/consumers/{name}/next?max={most}&wait=5")["events"]
        print(json.dumps(pulled), flush=True)
    elif command == "ack":
        acks = [{"group_id": e["group_id"], "seq": e["seq"]} for e in pulled]
        print(json.dumps(call("POST", f"/v1/consumers/{name}/ack", {"acks": acks})), flush=True)
