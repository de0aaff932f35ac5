"""`python -m backend serve [--config FILE] [--host H] [--port P]`: the engine as its own service.

It speaks the OpenAI-compatible HTTP API (the gateway's app with the embedded engine and no routing),
so a gateway reaches it through a deployment of kind `backend` and many replicas can run side by side.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "serve":
        sys.exit("usage: python -m backend serve [--config FILE] [--host HOST] [--port PORT]")
    from gateway.__main__ import main as serve

    serve(args[1:], embedded_only=True, prog="python -m backend serve")


if __name__ == "__main__":
    main()
