"""A LangGraph agent whose tools are Sluice's: it pays a supplier's invoice and tells accounts
payable, each tool call an effect recorded in Sluice's ledger before it runs.

Without OPENAI_API_KEY the model is LangChain's own test double (GenericFakeChatModel),
scripted to make the calls a real model makes here; with it (and `pip install
langchain-openai`), a real OpenAI model decides. Run it twice with the same RUN_ID: the second
run gets the same keys and the stored results, and the bank books one wire. A wire above
10,000.00 (AMOUNT_MINOR > 1000000) waits for a person's approval in Sluice: the graph stops
with LangGraph's interrupt and is resumed once the person runs the printed `sluice approve`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

import sluice
from sluice.adapters.langgraph import SluiceToolkit

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
    "(reference 'invoice 42'), then email ap@example.com that it is paid. Make each call once."
)


def model(tools: list[Any]) -> Any:
    if os.environ.get("OPENAI_API_KEY"):
        from langchain_openai import ChatOpenAI

        chat = ChatOpenAI(model=os.environ.get("SLUICE_EXAMPLE_MODEL", "gpt-4o-mini"))
        return chat.bind_tools(tools)
    calls = [("payments__wire", WIRE, "call-wire"), ("email__send", MAIL, "call-mail")]
    turns = [
        AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])
        for name, args, call_id in calls
    ]
    final = AIMessage(content="Paid invoice 42 and told accounts payable.")
    return GenericFakeChatModel(messages=iter([*turns, final]))


def main() -> None:
    with sluice.Client() as client, client.run(RUN_ID) as run:
        toolkit = SluiceToolkit(
            run, approval_wait=float(os.environ.get("APPROVAL_TIMEOUT_S", "600"))
        )
        tools = toolkit.get("payments/wire", "email/send")
        chat = model(tools)

        def agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [chat.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode(tools))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        app = graph.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": RUN_ID}}
        state = app.invoke({"messages": [("user", TASK)]}, config)
        while state.get("__interrupt__"):
            for paused in state["__interrupt__"]:
                key, remedy = (
                    paused.value["sluice"]["command_key"],
                    paused.value["sluice"]["remedy"],
                )
                print(f"waiting for a person's approval of {key}: {remedy}")
            # Go on: the tool waits for the person's decision in Sluice (approval_wait).
            state = app.invoke(Command(resume={"approved": True}), config)
        for message in state["messages"]:
            if isinstance(message, ToolMessage):
                print(f"tool output: {json.dumps(json.loads(message.content))}")
        print(f"final: {state['messages'][-1].content}")


if __name__ == "__main__":
    main()
