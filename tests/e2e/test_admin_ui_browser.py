"""The management web UI in a real headless Chromium: log in, purge a queue, close a
connection, dry-run and redrive dead letters by reason, each click checked with kombu or
py-amqp on the broker itself; a bystander publishing with confirms is untouched."""

from __future__ import annotations

import amqp
import kombu
import pytest
from brokerutil import ADMIN_GUEST, drain_until
from browserutil import chromium, require_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ORDERS = (
    '<queue name="orders" durable="true"><deadLetter><maxRedeliveries>1</maxRedeliveries>'
    "</deadLetter></queue>"
)
WAIT = 10  # seconds a page may take to show what a click did


def dead_letter(url: str) -> None:
    """Into orders-DLQ: two rejected, one past the delivery limit."""
    with kombu.Connection(url) as conn:
        q = kombu.Queue("orders", routing_key="orders", durable=True)
        prod = conn.Producer()
        for body in ("r1", "r2", "limit"):
            prod.publish(body, routing_key="orders", declare=[q], delivery_mode=2)
        q = q(conn.default_channel)
        for _ in range(2):
            q.get(no_ack=False).reject(requeue=False)
        for _ in range(2):  # maxRedeliveries 1: the second requeue dead-letters it
            q.get(no_ack=False).requeue()


def count(url: str, name: str) -> int:
    with kombu.Connection(url) as conn:
        return conn.default_channel.queue_declare(name, passive=True).message_count


def test_purge_close_and_redrive_by_clicking(broker_factory) -> None:
    require_or_skip()
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    b = broker_factory(ORDERS, admin=True, users=ADMIN_GUEST)
    url = b.url()
    dead_letter(url)
    with kombu.Connection(url) as conn:
        backlog = kombu.Queue("backlog", routing_key="backlog", auto_delete=False)
        for i in range(4):
            conn.Producer().publish({"n": i}, routing_key="backlog", declare=[backlog])
    bystander = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
    bystander.connect()
    by = bystander.channel()
    by.queue_declare("bystander", auto_delete=False)
    by.confirm_select()
    victim = amqp.Connection(f"127.0.0.1:{b.port}", userid="guest", password="guest")
    victim.connect()
    victim.channel()
    victim_port = victim.sock.getsockname()[1]

    with chromium() as d:
        wait = WebDriverWait(d, WAIT)

        def css(selector: str):
            return wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, selector)))

        def click(selector: str) -> None:
            """Click, again if the page's refresh replaced the element meanwhile (bounded)."""
            for attempt in range(5):
                try:
                    css(selector).click()
                    return
                except StaleElementReferenceException:
                    if attempt == 4:
                        raise

        def confirm(selector: str) -> None:
            """An acting button: the first click arms it (no refresh while armed), the second
            acts."""
            click(selector)
            wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, selector), "Confirm"))
            click(selector)

        def status(text: str) -> None:
            wait.until(ec.text_to_be_present_in_element((By.ID, "status"), text))

        d.get(f"http://127.0.0.1:{b.running.admin.port}/")
        css("#login-user").send_keys("guest")
        css("#login-password").send_keys("wrong")
        css("#login-submit").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "login-error"), "Login failed"))
        [refused] = d.get_log("browser")  # reading the log empties it
        assert "/api/whoami" in refused["message"] and "401" in refused["message"]
        css("#login-password").clear()
        css("#login-password").send_keys("guest")
        css("#login-submit").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "who"), "guest [administrator]"))
        wait.until(ec.text_to_be_present_in_element((By.ID, "ov-connections"), "2"))

        # queues: purge the backlog
        click("#nav-queues")
        cell = 'tr[data-queue="backlog"] td[data-field="messages"]'
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, cell), "4"))
        by.basic_publish(amqp.Message(b"before"), "", "bystander")
        confirm('button[data-action="purge"][data-queue="backlog"]')
        status("Purged 4 messages from backlog")
        assert count(url, "backlog") == 0
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, cell), "0"))

        # connections: close the victim's
        click("#nav-connections")
        row = f'tr[data-connection*=":{victim_port}#"] button[data-action="close"]'
        confirm(row)
        status("Closed connection")
        with pytest.raises(amqp.exceptions.ConnectionForced) as err:
            drain_until(victim, lambda: False, timeout=3)
        assert err.value.reply_code == 320

        # dead letters: browse, dry run and redrive the rejected ones only
        click("#nav-dead-letters")
        pick = css('select[data-queue="orders-DLQ"]')
        Select(pick).select_by_value("rejected")
        click('button[data-action="browse"][data-queue="orders-DLQ"]')
        wait.until(ec.text_to_be_present_in_element((By.ID, "dl-browse"), "2 messages dead"))
        click('button[data-action="dry-run"][data-queue="orders-DLQ"]')
        wait.until(ec.text_to_be_present_in_element((By.ID, "dl-result"), "would move orders=2"))
        assert count(url, "orders-DLQ") == 3  # a dry run moves nothing
        confirm('button[data-action="redrive"][data-queue="orders-DLQ"]')
        status("Redrove orders-DLQ: moved orders=2, kept 1")
        assert count(url, "orders") == 2 and count(url, "orders-DLQ") == 1

        # since the login, the page made no request the API refused or failed
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors

    by.basic_publish(amqp.Message(b"after"), "", "bystander")
    assert by.queue_declare("bystander", passive=True).message_count == 2
    bystander.close()


USERS = """
<user name="root" password="pw" vhosts="/ other" tags="administrator"/>
<user name="mgmt" password="pw" vhosts="other" tags="management"/>
"""


def test_a_management_user_sees_and_acts_in_its_vhosts_only(broker_factory) -> None:
    require_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    b = broker_factory(admin=True, users=USERS)
    for vhost, name in (("/", "root-q"), ("other", "mine")):
        conn = amqp.Connection(
            f"127.0.0.1:{b.port}", userid="root", password="pw", virtual_host=vhost
        )
        conn.connect()
        conn.channel().queue_declare(name, auto_delete=False)
        conn.close()
    root = amqp.Connection(f"127.0.0.1:{b.port}", userid="root", password="pw")
    root.connect()
    own = amqp.Connection(f"127.0.0.1:{b.port}", userid="mgmt", password="pw", virtual_host="other")
    own.connect()
    with chromium() as d:
        wait = WebDriverWait(d, WAIT)
        d.get(f"http://127.0.0.1:{b.running.admin.port}/")
        d.find_element(By.ID, "login-user").send_keys("mgmt")
        d.find_element(By.ID, "login-password").send_keys("pw")
        d.find_element(By.ID, "login-submit").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "who"), "mgmt [management]"))
        d.get(d.current_url.split("#")[0] + "#queues")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, 'tr[data-queue="mine"]')))
        names = [
            e.get_attribute("data-queue")
            for e in d.find_elements(By.CSS_SELECTOR, "tr[data-queue]")
        ]
        assert names == ["mine"]  # root-q is in "/", not its vhost
        d.get(d.current_url.split("#")[0] + "#connections")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "tr[data-connection]")))
        rows = d.find_elements(By.CSS_SELECTOR, "tr[data-connection]")
        closable = [
            r.get_attribute("data-connection")
            for r in rows
            if r.find_elements(By.CSS_SELECTOR, 'button[data-action="close"]')
        ]
        assert len(rows) == 1 and len(closable) == 1  # its own, in "other"; root's is not listed
        d.get(d.current_url.split("#")[0] + "#config")
        wait.until(
            ec.text_to_be_present_in_element((By.ID, "page"), "Only an administrator may read")
        )
    for conn in (root, own):
        conn.close()
