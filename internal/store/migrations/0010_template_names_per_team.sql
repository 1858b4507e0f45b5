-- +goose Up
-- Template names belong to a team: two teams may each have a template
-- called "app", and a name taken in one team is invisible to the others
-- (a global name space let a team squat names and learn other teams'
-- from the conflicts). A row now carries its template's team, and the
-- key is (team_id, name). Rebuilt rather than altered, which SQLite
-- cannot do to a primary key.
CREATE TABLE template_names_by_team (
    team_id      TEXT NOT NULL,
    name         TEXT NOT NULL,
    template_id  TEXT NOT NULL,
    PRIMARY KEY (team_id, name)
);
INSERT INTO template_names_by_team (team_id, name, template_id)
    SELECT t.team_id, n.name, n.template_id FROM template_names n JOIN templates t ON t.id = n.template_id;
DROP TABLE template_names;
ALTER TABLE template_names_by_team RENAME TO template_names;
CREATE INDEX template_names_by_template ON template_names (template_id);
