-- +goose Up
-- A node's workload identity key (issue 24): the public half of the key
-- it signs sandboxes' JWT-SVIDs with, as a JWK (JSON), so that the api
-- can publish every node's key in one JWKS. '' for a node that has none.
ALTER TABLE nodes ADD COLUMN identity_key TEXT NOT NULL DEFAULT '';
