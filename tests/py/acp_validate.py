"""Validates ACP JSON-RPC messages against the official ACP JSON Schema
(`schema/v1/schema.json` of the npm package @agentclientprotocol/sdk).

Reads one JSON message per line on stdin. Each must validate against the
schema's root (some Agent or Client message) and, more strictly, its params
or result against the definition its method names: SessionNotification for
`session/update`, RequestPermissionRequest for `session/request_permission`,
RequestPermissionResponse for a response carrying `result.outcome`.
Prints {"checked": n, "errors": [...]} on stdout.

    acp_validate.py SCHEMA.json < messages.jsonl
"""

import json
import sys

from jsonschema import Draft202012Validator


def main() -> None:
    schema = json.load(open(sys.argv[1]))
    root = Draft202012Validator(schema)

    def definition(name):
        return Draft202012Validator({"$ref": f"#/$defs/{name}", "$defs": schema["$defs"]})

    by_method = {
        "session/update": definition("SessionNotification"),
        "session/request_permission": definition("RequestPermissionRequest"),
    }
    response = definition("RequestPermissionResponse")
    checked, errors = 0, []
    for n, line in enumerate(sys.stdin):
        if not line.strip():
            continue
        message = json.loads(line)
        checked += 1
        problems = [e.message for e in root.iter_errors(message)]
        method = message.get("method")
        if method in by_method:
            problems += [e.message for e in by_method[method].iter_errors(message.get("params"))]
        elif "result" in message:
            problems += [e.message for e in response.iter_errors(message["result"])]
        else:
            problems.append(f"unexpected message kind (method {method!r})")
        if problems:
            errors.append({"line": n, "message": message, "problems": problems[:5]})
    json.dump({"checked": checked, "errors": errors}, sys.stdout)


if __name__ == "__main__":
    main()
