-- taskmesh: contract
-- taskmesh: no-transaction
-- The contract step of the search table (0020): the indexes of tasks the releases before it
-- search with leave, once no instance of another version runs. Dropped concurrently: creates,
-- claims and reads go on meanwhile. A database that applied 0020 before it was split this
-- way has dropped them already.
DROP INDEX CONCURRENTLY IF EXISTS tasks_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS tasks_queue_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS tasks_name_created_idx;
DROP INDEX CONCURRENTLY IF EXISTS tasks_tenant_created_idx;
