"""The web console: server-rendered pages under ``/console`` over the operator API.

Pages read, and forms act, through the instance's own API as the signed-in key
(:mod:`taskmesh.console.api_client`), so the console has the API's scopes, tenant rule, rate
limits and audit records, and nothing more. Templates are in ``templates/``, the stylesheet and
the one small script in ``static/`` (no CDN, no build step, no inline script: a strict CSP).

The package imports nothing itself: the API's sign-in needs only :mod:`taskmesh.console.sessions`,
and the pages (Jinja2, the API client, their routes) are imported by
:func:`taskmesh.console.routes.console_routes` at the console's first request
(:mod:`taskmesh.console.lazy`).
"""
