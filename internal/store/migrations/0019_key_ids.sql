-- +goose Up
-- API keys as E2B's API shows them (issue 24): IDs are UUIDs, and a key's
-- mask says its length. A key made before this kept its 16 hex digits of
-- ID: they become a UUID that holds all of them, so each old ID maps to
-- one new one: xxxxxxxx-xxxx-4xxx-8x00-000000000000. value_length is the
-- length of the key after its kind's prefix, 0 for keys made before this
-- (their length was never stored).
ALTER TABLE keys ADD COLUMN value_length INTEGER NOT NULL DEFAULT 0;
UPDATE keys SET id = substr(id, 1, 8) || '-' || substr(id, 9, 4) || '-4' || substr(id, 13, 3) || '-8' || substr(id, 16, 1) || '00-000000000000' WHERE length(id) = 16;
