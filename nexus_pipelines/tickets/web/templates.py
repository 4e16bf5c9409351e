"""The pages' templates and stylesheet, kept in the package (autoescaped Jinja2)."""

from __future__ import annotations

import jinja2

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}Tickets{% endblock %} · nexus tickets</title><link rel="stylesheet" href="/static/app.css">
</head><body>
<header><nav><strong>nexus tickets</strong>
{% if principal %}<a href="/board"{% if page == 'board' %} aria-current="page"{% endif %}>Board</a>
<a href="/attention"{% if page == 'attention' %} aria-current="page"{% endif %}>Attention
<span class="pill" data-testid="nav-attention">{{ counts | sum(attribute='attention') }}</span></a>
<span class="who">signed in as <b data-testid="actor">{{ principal.actor_id }}</b></span>
<form method="post" action="/signout" class="inline"><input type="hidden" name="csrf" value="{{ csrf }}">
<button type="submit">Sign out</button></form>{% endif %}</nav>
{% if counts %}<table class="counts" aria-label="Counts per project"><tr><th>Project</th><th>Your role</th>
<th>Tickets</th><th>Untriaged</th><th>Open</th><th>Done</th><th>Cancelled</th><th>Attention</th><th>Oldest waiting</th></tr>
{% for c in counts %}<tr data-project="{{ c.project_id }}"><td>{{ c.project_id }}</td><td>{{ c.role }}</td>
<td>{{ c.total }}</td><td class="untriaged" data-testid="untriaged-count">{{ c.untriaged }}</td><td>{{ c.open }}</td>
<td>{{ c.done }}</td><td>{{ c.cancelled }}</td><td data-testid="attention-count">{{ c.attention }}</td>
<td>{{ c.oldest_finding_age_s | age if c.oldest_finding_age_s is not none else '—' }}</td></tr>{% endfor %}
</table>{% endif %}</header>
<main>{% if notice %}<p class="notice" role="status">{{ notice }}</p>{% endif %}
{% if error %}<p class="error" role="alert" data-testid="error">{{ error }}</p>{% endif %}
{% block main %}{% endblock %}</main></body></html>"""

SIGNIN = """{% extends "base" %}{% block title %}Sign in{% endblock %}{% block main %}
<h1>Sign in</h1><form method="post" action="/signin" class="card narrow" autocomplete="off">
<input type="hidden" name="csrf" value="{{ csrf }}">
<label for="credential">Actor credential</label>
<input type="password" id="credential" name="credential" required autocomplete="current-password"
 placeholder="npa.…">
<p class="hint">The credential <code>nexus-pipelines actors add</code> printed for you.</p>
<button type="submit">Sign in</button></form>{% endblock %}"""

BOARD = """{% extends "base" %}{% block title %}Board{% endblock %}{% block main %}
<h1>Board</h1><p class="filters" aria-label="Triage filter">Triage:
<a href="/board"{% if not triage %} aria-current="true"{% endif %}>All</a>
{% for state in triage_states %}<a href="/board?triage={{ state }}" data-testid="filter-{{ state }}"
{% if triage == state %} aria-current="true"{% endif %}>{{ state | title }}</a>{% endfor %}</p>
<div class="lanes">{% for lane, column in lanes.items() %}<section class="lane" data-lane="{{ lane }}">
<h2>{{ lane | title }} <span class="pill">{{ column.total }}</span></h2>
{% if column.total > column.cards | length %}<p class="more" data-testid="more-{{ lane }}">Showing the first
{{ column.cards | length }} of {{ column.total }} (highest priority, then oldest); filter by triage state to narrow
the lane, or use <code>nexus-pipelines tickets list</code>.</p>{% endif %}
{% for card in column.cards %}<article class="card" data-ticket="{{ card.ticket_id }}">
<a href="/tickets/{{ card.ticket_id }}">#{{ card.ticket_id }} {{ card.title }}</a>
<div class="meta"><span class="badge t-{{ card.triage_state | lower }}">{{ card.triage_state }}</span>
<span class="badge">{{ card.priority }}</span> {{ card.project_id }} · {{ card.external_ref }} · {{ card.age_s | age }}</div>
</article>{% else %}<p class="empty">No tickets.</p>{% endfor %}</section>{% endfor %}</div>{% endblock %}"""

DETAIL = """{% extends "base" %}{% block title %}#{{ t.ticket_id }}{% endblock %}{% block main %}
{% macro hidden() %}<input type="hidden" name="csrf" value="{{ csrf }}">
<input type="hidden" name="expected_version" value="{{ t.version }}">
<input type="hidden" name="client_command_id" value="{{ command_id }}">{% endmacro %}
<h1>#{{ t.ticket_id }} {{ t.title }}</h1>
<dl class="facts"><dt>Triage</dt><dd><span class="badge t-{{ t.triage_state | lower }}" data-testid="triage-state">
{{ t.triage_state }}</span></dd>
<dt>Priority</dt><dd data-testid="priority">{{ t.priority }}{% if automatic %} (automatic default at intake){% endif %}</dd>
<dt>Status</dt><dd>{{ t.status }}</dd><dt>Project</dt><dd>{{ t.tenant }}/{{ t.project }}</dd>
<dt>Source</dt><dd>{{ t.connector_kind }} <code>{{ t.external_ref }}</code> ({{ t.source_state }} at the source)
{% if link %} · <a href="{{ link }}" rel="noopener noreferrer" target="_blank">open in {{ t.connector_kind }}</a>{% endif %}</dd>
<dt>Age</dt><dd>{{ t.age_s | age }} (since {{ t.created_at.strftime('%Y-%m-%d %H:%M') }} UTC)</dd>
<dt>Version</dt><dd>{{ t.version }}</dd>
{% for f in t.findings %}<dt>Attention</dt><dd data-testid="finding" data-kind="{{ f.kind }}">
{% if not f.disposition %}<span class="badge warn">unresolved</span> {{ f.kind }} for the {{ f.owner_role }}, waiting
{{ f.age_s | age }}: {{ meaning[f.kind] }}; resolved by {{ resolved_by(f.kind, t.triage_state) }}
{% else %}{{ f.kind }} resolved: {{ f.disposition }}{% endif %}</dd>
{% else %}<dt>Attention</dt><dd data-testid="finding">none</dd>{% endfor %}
{% for r in t.relations %}<dt>Relation</dt><dd>{% if r.direction == 'outgoing' %}duplicates
<a href="/tickets/{{ r.ticket_id }}">#{{ r.ticket_id }}</a>{% else %}duplicated by
<a href="/tickets/{{ r.ticket_id }}">#{{ r.ticket_id }}</a>{% endif %}</dd>{% endfor %}</dl>
{% if 'priority' in controls %}<form method="post" action="/tickets/{{ t.ticket_id }}/priority" class="card"
 data-testid="priority-form"><h2>Set priority</h2>{{ hidden() }}
<label for="priority">Priority</label><select id="priority" name="priority">{% for p in priorities %}
<option{% if p == t.priority %} selected{% endif %}>{{ p }}</option>{% endfor %}</select>
<label for="priority-reason">Reason</label><input id="priority-reason" name="reason" required maxlength="500">
<button type="submit">Record priority</button></form>{% endif %}
{% if 'triage' in controls %}<form method="post" action="/tickets/{{ t.ticket_id }}/triage" class="card"
 data-testid="triage-form"><h2>Triage</h2>{{ hidden() }}
<fieldset><legend>Disposition</legend>{% for d in dispositions %}<label class="choice">
<input type="radio" name="disposition" value="{{ d }}" required> {{ d | title }}</label>{% endfor %}</fieldset>
<label for="canonical">Canonical ticket (for a duplicate)</label>
<input id="canonical" name="canonical_ticket_id" inputmode="numeric" pattern="[0-9]*" placeholder="ticket number">
<label for="triage-reason">Reason</label><input id="triage-reason" name="reason" required maxlength="500">
{% if automatic %}<p class="hint">Accepting needs a priority set by a commander or operator first.</p>{% endif %}
<button type="submit">Record triage</button></form>{% endif %}
{% if waiting_gap %}<form method="post" action="/tickets/{{ t.ticket_id }}/acknowledge" class="card"
 data-testid="acknowledge-form"><h2>Acknowledge the sweep gap</h2>{{ hidden() }}
<input type="hidden" name="through_finding_id" value="{{ waiting_gap }}">
<label for="acknowledge-reason">Reason</label><input id="acknowledge-reason" name="reason" required maxlength="500">
<button type="submit">Acknowledge</button></form>{% endif %}
<h2>Trail</h2><table class="trail"><tr><th>When (UTC)</th><th>Fact</th><th>By</th><th>Reason</th></tr>
{% for f in t.trail %}<tr><td>{{ f.recorded_at.strftime('%Y-%m-%d %H:%M:%S') }}</td>
<td>{{ f.kind }} {% if f.prior %}{{ f.prior }} → {% endif %}{{ f.value }}</td>
<td>{{ f.actor }}{% if f.actor_role %} ({{ f.actor_role }}){% endif %}</td><td>{{ f.reason }}</td></tr>{% endfor %}
</table><h2>Description</h2><pre class="description">{{ t.description or '(empty)' }}</pre>{% endblock %}"""

ATTENTION = """{% extends "base" %}{% block title %}Attention{% endblock %}{% block main %}
<h1>Attention</h1><p>Unresolved findings, oldest first. Nothing here expires: each waits for its owner.</p>
<table class="attention"><tr><th>Waiting</th><th>Finding</th><th>Owner</th><th>Resolved by</th><th>Project</th>
<th>Ticket</th><th>Triage</th><th>Status</th><th>Priority</th></tr>{% for f in findings %}
<tr data-ticket="{{ f.ticket_id }}" data-kind="{{ f.kind }}">
<td>{{ f.age_s | age }}</td><td><code>{{ f.kind }}</code>: {{ f.meaning }}</td><td>{{ f.owner_role }}</td>
<td data-testid="resolved-by">{{ f.resolved_by }}</td><td>{{ f.project_id }}</td>
<td><a href="/tickets/{{ f.ticket_id }}">#{{ f.ticket_id }} {{ f.title }}</a></td><td>{{ f.triage_state }}</td>
<td>{{ f.status }}</td><td>{{ f.priority }}</td></tr>{% else %}<tr><td colspan="9" class="empty">Nothing is waiting.</td>
</tr>{% endfor %}</table>{% endblock %}"""

NOT_FOUND = """{% extends "base" %}{% block title %}Not found{% endblock %}{% block main %}
<h1>Not found</h1><p><a href="/board">Back to the Board</a></p>{% endblock %}"""

CSS = """body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;background:#f5f6f8}
header{background:#fff;border-bottom:1px solid #d8dce2;padding:.6rem 1.2rem}
nav{display:flex;gap:1.1rem;align-items:center}nav a{color:#1d4ed8;text-decoration:none}
nav a[aria-current]{font-weight:700;text-decoration:underline}.who{margin-left:auto;color:#555}
main{padding:1rem 1.2rem;max-width:1200px}h1{margin:.3rem 0 .8rem}h2{font-size:1.05rem}
table{border-collapse:collapse;background:#fff}th,td{border:1px solid #d8dce2;padding:.3rem .55rem;text-align:left}
.counts{margin-top:.6rem;font-size:.9rem}.counts .untriaged{font-weight:700;color:#9a3412}
.lanes{display:grid;grid-template-columns:repeat(3,1fr);gap:1rem}.lane{background:#eceff3;padding:.5rem;border-radius:6px}
.card{background:#fff;border:1px solid #d8dce2;border-radius:6px;padding:.6rem .8rem;margin:.5rem 0}
.card a{color:#111;font-weight:600}.meta{font-size:.85rem;color:#555;margin-top:.25rem}
.badge{display:inline-block;border-radius:4px;padding:0 .35rem;background:#e5e7eb;font-size:.8rem;font-weight:600}
.t-untriaged{background:#fed7aa;color:#7c2d12}.t-accepted{background:#bbf7d0;color:#14532d}
.t-duplicate,.t-rejected{background:#e5e7eb;color:#374151}.warn{background:#fecaca;color:#7f1d1d}
.pill{background:#1d4ed8;color:#fff;border-radius:9px;padding:0 .45rem;font-size:.8rem}
.filters a{margin-right:.6rem}.filters a[aria-current]{font-weight:700}
.facts{display:grid;grid-template-columns:9rem 1fr;gap:.3rem .8rem;background:#fff;padding:.8rem;border-radius:6px}
.facts dt{font-weight:600;color:#444}.facts dd{margin:0}
form.card{max-width:34rem}form.narrow{max-width:24rem}label{display:block;margin:.5rem 0 .15rem;font-weight:600}
label.choice{display:inline;font-weight:400;margin-right:1rem}input,select{font:inherit;padding:.3rem;width:100%;
box-sizing:border-box}input[type=radio]{width:auto}button{font:inherit;margin-top:.7rem;padding:.35rem .9rem;
border:1px solid #1d4ed8;background:#1d4ed8;color:#fff;border-radius:4px;cursor:pointer}
form.inline{display:inline}form.inline button{margin:0;background:#fff;color:#1d4ed8}
.notice{background:#dcfce7;border:1px solid #86efac;padding:.5rem .8rem}
.error{background:#fee2e2;border:1px solid #fca5a5;padding:.5rem .8rem}.hint{color:#555;font-size:.85rem}
.empty{color:#666}.description{white-space:pre-wrap;background:#fff;padding:.8rem;border-radius:6px}
fieldset{border:1px solid #d8dce2}"""


def age(seconds: int) -> str:
    """A short human age: 45s, 12m, 3h 20m, 2d 4h."""
    seconds = max(int(seconds), 0)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else f"{secs}s"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.DictLoader({"base": BASE, "signin": SIGNIN, "board": BOARD, "detail": DETAIL,
                                  "attention": ATTENTION, "not_found": NOT_FOUND}),
        autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["age"] = age
    return env
