"""Drives Ferry's OXP server with the official OXP Python client (`oxp`).

Prints one JSON object on stdout: {"ok": true, "response": ...} or
{"ok": false, "error": <exception class>, "status": <HTTP status>, "body": ...}.
The Rust tests in tests/tests/oxp.rs run it against a real ferry.

    oxp_client.py --base http://HOST/oxp [auth options] health
    oxp_client.py --base ... list
    oxp_client.py --base ... call --tool-id demo.echo --input '{"text": "hi"}'
        [--call-id ID] [--user-id U] [--schema urn:oxp:1.0]

Auth options: --bearer TOKEN, or --jwt-secret S [--jwt-exp-in SECONDS]
[--jwt-fractional]
[--jwt-nbf-in SECONDS] [--jwt-sub SUB]
[--jwt-aud AUD] to mint an HS256 token with PyJWT, and --api-key KEY for
the OXP-API-Key header.
"""

import argparse
import json
import sys
import time

import jwt
import oxp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--bearer", default="unused-when-auth-is-off")
    p.add_argument("--jwt-secret")
    p.add_argument("--jwt-exp-in", type=int, default=300)
    p.add_argument("--jwt-aud")
    p.add_argument("--jwt-nbf-in", type=int)
    p.add_argument("--jwt-sub", default="ferry-tests")
    # RFC 7519's NumericDate may be fractional: send exp with a fraction.
    p.add_argument("--jwt-fractional", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("command", choices=["health", "list", "call"])
    p.add_argument("--tool-id")
    p.add_argument("--input", default="{}")
    p.add_argument("--call-id")
    p.add_argument("--user-id")
    p.add_argument("--schema")
    a = p.parse_args()

    bearer = a.bearer
    if a.jwt_secret:
        exp = int(time.time()) + a.jwt_exp_in
        claims = {"sub": a.jwt_sub, "exp": exp + 0.5 if a.jwt_fractional else exp}
        if a.jwt_aud:
            claims["aud"] = a.jwt_aud
        if a.jwt_nbf_in is not None:
            claims["nbf"] = int(time.time()) + a.jwt_nbf_in
        bearer = jwt.encode(claims, a.jwt_secret, algorithm="HS256")
    headers = {"OXP-API-Key": a.api_key} if a.api_key else None
    # No automatic retries: each test asserts on one answer.
    client = oxp.Oxp(
        bearer_token=bearer,
        base_url=a.base,
        max_retries=0,
        timeout=a.timeout,
        default_headers=headers,
    )
    try:
        if a.command == "health":
            client.health.check()
            out = {"ok": True, "response": None}
        elif a.command == "list":
            out = {"ok": True, "response": client.tools.list().model_dump(by_alias=True)}
        else:
            request = {"tool_id": a.tool_id, "input": json.loads(a.input)}
            if a.call_id:
                request["call_id"] = a.call_id
            if a.user_id:
                request["context"] = {"user_id": a.user_id}
            kwargs = {"schema": a.schema} if a.schema else {}
            response = client.tools.call(request=request, **kwargs)
            out = {"ok": True, "response": response.model_dump(by_alias=True, exclude_unset=True)}
    except oxp.APIStatusError as e:
        try:
            body = e.response.json()
        except ValueError:
            body = e.response.text
        out = {"ok": False, "error": type(e).__name__, "status": e.status_code, "body": body}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
