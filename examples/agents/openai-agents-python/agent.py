"""An OpenAI Agents SDK agent whose tools are Sluice's: it pays a supplier's invoice and tells
accounts payable, each tool call an effect recorded in Sluice's ledger before it runs.

Without OPENAI_API_KEY the model is the SDK's own test double (agents.testing.ScriptedModel),
scripted to make the calls a real model makes here; with it, a real OpenAI model decides.
Run it twice with the same RUN_ID: the second run gets the same keys and the stored results,
and the bank books one wire. A wire above 10,000.00 (AMOUNT_MINOR > 1000000) waits for a
person's approval in Sluice: the run stops with the SDK's interruption and goes on once the
person runs the printed `sluice approve` line.
"""

from __future__ import annotations

import asyncio
import os

from agents import Agent, Runner, ToolCallOutputItem, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

import sluice
from sluice.adapters.openai_agents import SluiceTools

RUN_ID = os.environ.get("RUN_ID", "invoice-42")
AMOUNT = int(os.environ.get("AMOUNT_MINOR", "125000"))
WIRE = {
    "account": "acc-ops",
    "beneficiary": "supplier-7",
    "amount_minor": AMOUNT,
    "date": "2026-11-22",
    "reference": "invoice 42",
}
MAIL = {
    "to": "ap@example.com",
    "subject": "invoice 42 paid",
    "body": f"{AMOUNT} paid to supplier-7",
}
TASK = (
    f"Pay invoice 42: wire {AMOUNT} minor units from acc-ops to supplier-7 dated 2026-11-22 "
    "(reference 'invoice 42'), then email ap@example.com that it is paid."
)


def model() -> str | ScriptedModel | None:
    if os.environ.get("OPENAI_API_KEY"):
        return os.environ.get("SLUICE_EXAMPLE_MODEL")  # None: the SDK's default model
    set_tracing_disabled(True)
    return ScriptedModel(
        [
            [function_call("payments__wire", WIRE, call_id="call-wire")],
            [function_call("email__send", MAIL, call_id="call-mail")],
            [assistant_message("Paid invoice 42 and told accounts payable.")],
        ]
    )


async def main() -> None:
    async with sluice.AsyncClient() as client, client.run(RUN_ID) as run:
        tools = SluiceTools(run)
        agent = Agent(
            name="accounts payable",
            instructions="You pay invoices with the tools you have. Make each call once.",
            model=model(),
            tools=await tools.get("payments/wire", "email/send"),
        )
        result = await Runner.run(agent, TASK)
        while result.interruptions:
            state = result.to_state()
            for item in result.interruptions:
                pending = tools.pending(item)
                if pending is not None:
                    key, remedy = pending.command_key, pending.remedy
                    print(f"waiting for a person's approval of {key}: {remedy}")
            timeout = float(os.environ.get("APPROVAL_TIMEOUT_S", "600"))
            if await tools.settle(state, timeout=timeout):
                print(f"still waiting; run this again with RUN_ID={RUN_ID} once a person decided")
                raise SystemExit(3)
            result = await Runner.run(agent, state)
        for item in result.new_items:
            if isinstance(item, ToolCallOutputItem):
                print(f"tool output: {item.output}")
        print(f"final: {result.final_output}")


if __name__ == "__main__":
    asyncio.run(main())
