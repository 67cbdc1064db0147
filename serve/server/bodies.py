"""Saying what is wrong with a request body as a whole, in the client's terms.

FastAPI reads a body as JSON only under a JSON content type (application/json, application/*+json, or none), and
validates the result as the request object: an empty body comes back as "Field required", a text/plain one or a
JSON array as "Input should be a valid dictionary", both with no field to name. These say what to send instead.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

NEEDS = {"chat": "`model` and `messages`", "completions": "`model` and `prompt`"}
JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


def is_json_media(content_type: str | None) -> bool:
    """Whether FastAPI parses a body of this Content-Type as JSON (a missing one counts as JSON)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if not media:
        return True
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def body_problem(errors: Sequence[dict[str, Any]], *, content_type: str | None, body: bytes,
                 endpoint: str) -> tuple[str, None] | None:
    """(message, param) for a body that is unusable as a whole (not sent as JSON, empty, JSON but not an object);
    None when the validation errors are about its fields."""
    if not any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        return None
    needs = NEEDS.get(endpoint, "the request's fields")
    if not is_json_media(content_type):
        media = (content_type or "").split(";")[0].strip()
        return f"Content-Type must be application/json (got {media}); send a JSON object with {needs}", None
    if not body.strip():
        return f"the request body is empty: send a JSON object with {needs}", None
    try:
        kind = JSON_KINDS.get(type(json.loads(body)), "not an object")
    except ValueError:  # invalid JSON is reported by FastAPI itself, with where it breaks
        return None
    return f"the request body must be a JSON object with {needs}, got {kind}", None
