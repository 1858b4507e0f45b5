-- +goose Up
-- On PostgreSQL a sandbox's route_seq is now the ID of the transaction
-- that changed its routing (routes.go), no longer a value of the one-row
-- sandbox_route_seq, whose row lock serialised every create. The values
-- of the counter mean nothing among transaction IDs: they go (every api
-- process reads all routes at its start). SQLite keeps the counter;
-- resetting its values there is harmless for the same reason.
UPDATE sandboxes SET route_seq = 0;
