-- +goose Up
-- A team's sandboxes of one state, newest first, and their count by node
-- (GET /v2/sandboxes?state=…, and its X-Total-Running on every page):
-- sandboxes_by_team alone makes both walk every sandbox of the team, 60,000
-- rows for a team with 10,000 running and 50,000 paused (test/scale).
-- node last, so that the count reads only the index.
CREATE INDEX sandboxes_by_team_state ON sandboxes (team_id, state, started_at, id, node);
-- A node's sandboxes (its start-up recovery, a lost node's listing).
CREATE INDEX sandboxes_by_node ON sandboxes (node);

