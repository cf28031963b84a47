-- What each instance advertises about the handlers it has registered, with every heartbeat:
-- {name: {"queue", "max_retries", "payload_schema"}} (advertised.py). An instance without a
-- task name's handler (the dev profile, an API-only instance, a client) routes a create to the
-- handler's queue, applies its retries and checks its payload by it, and the dev profile's
-- demo fallback refuses a name a live instance advertises. NULL: an older version, which says
-- nothing. Unlike `handlers`, it lists a fallback instance's registered handlers too.
ALTER TABLE workers ADD COLUMN handler_options jsonb;
