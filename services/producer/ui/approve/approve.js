// An approval link's page (services/producer/src/links.rs). The token is the page's own
// address: the command is read from it as JSON and the decision is POSTed back to it. Every
// value from the command goes into the page with textContent, never as HTML.

const $ = (id) => document.getElementById(id);
const address = window.location.pathname;

function show(id, text) {
  const el = $(id);
  el.textContent = text;
  el.hidden = false;
}

function problem(text) {
  $("loading").hidden = true;
  $("command").hidden = true;
  show("problem", text);
}

async function answer(response) {
  try {
    return await response.json();
  } catch {
    return {};
  }
}

async function load() {
  let response;
  try {
    response = await fetch(address, { headers: { Accept: "application/json" }, cache: "no-store" });
  } catch {
    problem("Sluice could not be reached; try again in a moment.");
    return;
  }
  const body = await answer(response);
  if (!response.ok) {
    problem(body.message || `Sluice answered ${response.status}.`);
    return;
  }
  $("tool").textContent = body.tool;
  $("run").textContent = body.run_id;
  $("key").textContent = body.command_key;
  $("submitter").textContent = body.submitted_by || "(not recorded)";
  $("tenant").textContent = body.tenant || "";
  $("created").textContent = body.created_at;
  $("why").textContent = body.blocked_because || "waiting for approval";
  const link = body.link;
  $("link").textContent =
    `${link.for ? `for ${link.for}, ` : ""}issued by ${link.issued_by}, expires ${link.expires_at}`;
  $("args").textContent = JSON.stringify(body.args, null, 2);
  $("loading").hidden = true;
  $("command").hidden = false;
}

async function decide(decision) {
  const reason = $("reason").value;
  if (!reason.trim()) {
    $("reason").setAttribute("aria-invalid", "true");
    $("reason").focus();
    show("done", "A reason is required.");
    return;
  }
  for (const id of ["approve", "reject"]) $(id).disabled = true;
  let response;
  try {
    response = await fetch(address, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify({ decision, reason }),
    });
  } catch {
    for (const id of ["approve", "reject"]) $(id).disabled = false;
    show("done", "Sluice could not be reached; nothing was decided. Try again.");
    return;
  }
  const body = await answer(response);
  if (response.ok) {
    $("command").hidden = true;
    show("done", decision === "approve" ? `Approved: the command is now ${body.status}.` : `Rejected: the command is now ${body.status}.`);
  } else if (response.status === 410) {
    problem(body.message);
  } else {
    for (const id of ["approve", "reject"]) $(id).disabled = false;
    show("done", body.message || `Sluice answered ${response.status}; nothing was decided.`);
  }
}

$("approve").addEventListener("click", () => decide("approve"));
$("reject").addEventListener("click", () => decide("reject"));
load();
