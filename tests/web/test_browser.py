"""The pages in a real browser: a commander signs in, filters the Board, prioritizes and
triages a ticket and sees the untriaged count drop; an operator's ticket page has no
triage controls and a triage form forged in the page is refused by the server; a sweep gap
on an accepted ticket waits on Attention, saying who resolves it, until the commander
acknowledges it on the ticket's page."""

from __future__ import annotations

import pytest

from nexus_pipelines.local.simulators.http import serve_in_thread
from nexus_pipelines.tickets.web.app import build_app
from tests.web.support import gap_on_an_accepted_ticket, seed


@pytest.fixture(scope="module")
def site(pool):
    seeded = seed(pool, issues=3)
    url, stop = serve_in_thread(build_app(pool))
    yield url, seeded
    stop()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    context.set_default_timeout(10_000)
    yield context.new_page()
    context.close()


def sign_in(page, url: str, credential: str) -> None:
    page.goto(f"{url}/board")
    assert page.url.endswith("/signin")
    page.fill("#credential", credential)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/board")


def test_a_commander_filters_the_board_triages_and_sees_the_count_drop(page, site):
    url, seeded = site
    sign_in(page, url, seeded.commander)
    assert seeded.commander not in page.url
    untriaged = page.get_by_test_id("untriaged-count")
    assert untriaged.inner_text() == "3"
    page.get_by_test_id("filter-UNTRIAGED").click()
    page.wait_for_url("**/board?triage=UNTRIAGED")
    assert page.locator("section[data-lane=open] article").count() == 3
    first = seeded.ticket_ids[0]
    page.click(f"article[data-ticket='{first}'] a")
    page.wait_for_url(f"{url}/tickets/{first}")
    assert page.get_by_test_id("triage-state").inner_text() == "UNTRIAGED"
    page.select_option("#priority", "P1")
    page.fill("#priority-reason", "blocks checkout")
    page.click("[data-testid=priority-form] button")
    page.wait_for_url("**done=priority")
    assert page.get_by_test_id("priority").inner_text() == "P1"
    page.check("input[name=disposition][value=ACCEPTED]")
    page.fill("#triage-reason", "confirmed in production")
    page.click("[data-testid=triage-form] button")
    page.wait_for_url("**done=triage")
    assert page.get_by_test_id("triage-state").inner_text() == "ACCEPTED"
    assert page.get_by_test_id("triage-form").count() == 0
    assert page.get_by_test_id("untriaged-count").inner_text() == "2"
    page.click("nav >> text=Attention")
    page.wait_for_url(f"{url}/attention")
    assert page.locator(f"tr[data-ticket='{first}']").count() == 0
    assert page.locator("tr[data-ticket]").count() == 2


def test_an_operator_sees_no_triage_controls_and_a_forged_post_is_refused(page, site):
    url, seeded = site
    sign_in(page, url, seeded.operator)
    ticket = seeded.ticket_ids[1]
    page.goto(f"{url}/tickets/{ticket}")
    assert page.get_by_test_id("priority-form").count() == 1
    assert page.get_by_test_id("triage-form").count() == 0
    # Re-point the operator's own (valid) form at the triage command, with a role field added.
    page.evaluate("""() => {
        const form = document.querySelector('[data-testid=priority-form]');
        form.action = form.action.replace('/priority', '/triage');
        for (const [name, value] of [['disposition', 'REJECTED'], ['role', 'commander']]) {
            const input = document.createElement('input');
            input.type = 'hidden'; input.name = name; input.value = value; form.appendChild(input);
        }
        document.querySelector('#priority-reason').value = 'forged';
    }""")
    with page.expect_response(f"{url}/tickets/{ticket}/triage") as response:
        page.click("[data-testid=priority-form] button")
    assert response.value.status == 403
    assert "triage needs commander" in page.get_by_test_id("error").inner_text()
    assert page.get_by_test_id("triage-state").inner_text() == "UNTRIAGED"
    posted = page.request.post(f"{url}/tickets/{ticket}/priority", form={"priority": "P0", "reason": "no token"})
    assert posted.status == 403  # the session cookie alone, without the form's CSRF token


def test_a_sweep_gap_on_an_accepted_ticket_waits_on_attention_until_its_commander_acknowledges_it(page, site, pool):
    url, _ = site
    ticket, commander = gap_on_an_accepted_ticket(pool)
    sign_in(page, url, commander)
    page.click("nav >> text=Attention")
    page.wait_for_url(f"{url}/attention")
    row = page.locator(f"tr[data-ticket='{ticket}'][data-kind=connector_sweep_gap]")
    assert row.count() == 1
    assert "missed" in row.inner_text() and "ACCEPTED" in row.inner_text()
    assert row.get_by_test_id("resolved-by").inner_text() == "the commander's acknowledgement"
    row.locator("a").click()
    page.wait_for_url(f"{url}/tickets/{ticket}")
    assert "unresolved" in page.locator("[data-testid=finding][data-kind=connector_sweep_gap]").inner_text()
    page.fill("#acknowledge-reason", "the scan's bound was fixed")
    page.click("[data-testid=acknowledge-form] button")
    page.wait_for_url("**done=acknowledge")
    assert "resolved: ACKNOWLEDGED" in page.locator("[data-testid=finding][data-kind=connector_sweep_gap]").inner_text()
    assert page.get_by_test_id("acknowledge-form").count() == 0
    assert page.get_by_test_id("triage-state").inner_text() == "ACCEPTED"
    page.click("nav >> text=Attention")
    page.wait_for_url(f"{url}/attention")
    assert page.locator(f"tr[data-ticket='{ticket}']").count() == 0
