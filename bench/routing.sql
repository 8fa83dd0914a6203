-- The routing transaction in raw SQL: the five statements of one intake, with no web layer.
-- Run by bench/run.py next to the HTTP figures (pgbench -n -f bench/routing.sql -D gmin=.. -D gmax=..).
-- gmin..gmax: ids of the groups to route into (gmin = gmax: one hot group).
-- Lock order as in leads/routing.py: the group's rotation row first, then the writes.
\set gid random(:gmin, :gmax)
BEGIN;
-- 1. lock: the group's rotation row (FOR NO KEY UPDATE, as the ORM's select_for_update(no_key=True))
SELECT pointer FROM rotation_rotationstate WHERE group_id = :gid FOR NO KEY UPDATE \gset
-- 2. pick: the first eligible member at or after the pointer, wrapping (round robin)
SELECT m.rep_id, m.position FROM rotation_membership m JOIN rotation_rep r ON r.id = m.rep_id
 WHERE m.group_id = :gid AND m.active AND r.active
 ORDER BY (m.position < :pointer), m.position, m.rep_id LIMIT 1 \gset
-- 3. insert the lead, assigned to the rep picked
INSERT INTO leads_lead (email, email_normalized, first_name, last_name, company, phone, country, region,
  source, product, external_id, attributes, raw_payload, requested_group, status, queue_reason, outcome,
  escalations, created_at, assigned_at, group_id, owner_id)
VALUES ('raw' || :client_id || '@bench.example', 'raw' || :client_id || '@bench.example', '', '', '', '', '', '',
  'pgbench', '', '', '{}', '{}', '', 'assigned', '', '', 0, now(), now(), :gid, :rep_id)
RETURNING id AS lead_id \gset
-- 4. insert the audit event explaining the decision
INSERT INTO audit_auditevent (type, at, actor, lead_id, "group", rep_id, explanation, request_id)
VALUES ('lead.assigned', now(), 'pgbench', :lead_id, 'raw', :rep_id,
  jsonb_build_object('chosen', :rep_id, 'pointer_before', :pointer, 'pointer_after', :position + 1), '');
-- 5. advance the rotation
UPDATE rotation_rotationstate SET pointer = :position + 1, turns = turns + 1, updated_at = now() WHERE group_id = :gid;
COMMIT;
