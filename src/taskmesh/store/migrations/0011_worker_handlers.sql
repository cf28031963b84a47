-- The task names each instance has a handler for, so that a create whose name no
-- live instance serving its queue can run is answered with a warning (a typo such as
-- `reprot.export` would otherwise fail only when a worker claims it). NULL: any name (the
-- instance has a fallback handler, as the dev profile's demo), or an instance of an older
-- version, which never causes a warning.
ALTER TABLE workers ADD COLUMN handlers text[];
