import { fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { describe, expect, it, vi } from 'vitest';
import Approvals from './Approvals.svelte';
import Audit from './Audit.svelte';
import Sessions from './Sessions.svelte';
import Tools from './Tools.svelte';
import Servers from './Servers.svelte';
import Settings from './Settings.svelte';
import Connect from './Connect.svelte';
import type { ApprovalView, Ipc, ServerRow, SessionRow, ToolsView } from '../lib/ipc';

const listen = async () => () => {};

describe('Approvals', () => {
  it('lists waiting questions newest first and opens one', async () => {
    const q = (id: string, at: number): ApprovalView => ({
      id, kind: 'per_use', execution_id: `act_${id}`, title: `question ${id}`, intro: null, details: null, rows: [], timeline: [],
      choices: [], asked_at: at, deadline: at + 120_000,
    });
    const openApproval = vi.fn(async () => undefined);
    const ipc = { pendingApprovals: vi.fn(async () => [q('q2', 2), q('q1', 1)]), onApprovalsChanged: listen, openApproval } as unknown as Ipc;
    render(Approvals, { props: { ipc } });
    const table = await screen.findByTestId('approvals');
    expect(table.textContent!.indexOf('question q2')).toBeLessThan(table.textContent!.indexOf('question q1'));
    await fireEvent.click(screen.getAllByText('Open')[0]);
    expect(openApproval).toHaveBeenCalledWith('q2');
  });

  it('says when nothing waits', async () => {
    const ipc = { pendingApprovals: vi.fn(async () => []), onApprovalsChanged: listen } as unknown as Ipc;
    render(Approvals, { props: { ipc } });
    expect(await screen.findByTestId('approvals-empty')).toBeTruthy();
  });
});

describe('Sessions', () => {
  const run = (id: string, ended: boolean, authorization: string | null): SessionRow => ({
    id, actor: 'process:/usr/bin/agent@sha256:ab', pid: 42, transport: 'stdio', client: 'claude 1.0', started_at: 0,
    ended_at: ended ? 1 : null, end_reason: ended ? 'process_exited' : null, calls: 3, authorization, authorized_by: authorization ? 'desktop' : null,
  });

  it('offers revoke only for live, unrevoked runs, and revokes', async () => {
    let list = [run('s1', false, 'authorized'), run('s2', true, 'authorized'), run('s3', false, 'revoked')];
    const revokeSession = vi.fn(async (id: string) => {
      list = list.map((s) => (s.id === id ? { ...s, authorization: 'revoked' } : s));
    });
    const ipc = { sessions: vi.fn(async () => list), revokeSession, onJournalChanged: listen } as unknown as Ipc;
    render(Sessions, { props: { ipc } });
    await screen.findByTestId('sessions');
    expect(screen.getAllByText('Revoke').length).toBe(1);
    await fireEvent.click(screen.getByText('Revoke'));
    expect(revokeSession).toHaveBeenCalledWith('s1');
    await waitFor(() => expect(screen.queryByText('Revoke')).toBeNull());
  });

  it('has an empty state', async () => {
    render(Sessions, { props: { ipc: { sessions: vi.fn(async () => []), onJournalChanged: listen } as unknown as Ipc } });
    expect(await screen.findByTestId('sessions-empty')).toBeTruthy();
  });
});

describe('Tools', () => {
  it('shows a refused manifest with file and line, and the tools agents see', async () => {
    const view: ToolsView = {
      manifest: '/home/u/.config/postern/tools.toml',
      tools: [{ name: 'http_request', description: 'Send an HTTP request', annotations: '{"destructiveHint":true}', input_schema: '{}' }],
      errors: [{ file: '/home/u/.config/postern/tools.toml', line: 7, tool: 'pay', message: 'a side-effecting tool needs a replay contract' }],
    };
    render(Tools, { props: { ipc: { tools: vi.fn(async () => view) } as unknown as Ipc } });
    const errors = await screen.findByTestId('manifest-errors');
    expect(errors.textContent).toContain('/home/u/.config/postern/tools.toml:7: tool pay: a side-effecting tool needs a replay contract');
    expect(screen.getByTestId('tools').textContent).toContain('destructiveHint');
  });
});

describe('Audit', () => {
  it('verifies and reports tampering', async () => {
    const ipc = {
      onAuditProgress: listen,
      auditVerify: vi.fn(async () => ({ intact: false, rows: 10, executions: 2, head: 'sha256:ab', findings: ['row 4 was modified'], elapsed_ms: 3 })),
    } as unknown as Ipc;
    render(Audit, { props: { ipc } });
    await fireEvent.click(screen.getByTestId('verify'));
    const result = await screen.findByTestId('audit-result');
    expect(result.textContent).toContain('TAMPERING FOUND');
    expect(screen.getByText('row 4 was modified')).toBeTruthy();
  });
});

describe('Servers', () => {
  const server = (state: string, last_error: string | null): ServerRow => ({
    name: 'github', state, last_error, launched: 'npx -y @modelcontextprotocol/server-github', secret_env: ['GITHUB_TOKEN'],
    approve_every_use: false,
    start: 'with_gateway',
    sign_in: null,
    tools: [
      { name: 'github__search_issues', tool: 'search_issues', contract: 'irreversible', idempotency_argument: null,
        contract_from: 'hints_unconfirmed', hinted: 'read_only', approve_every_use: false, arguments: ['query'] },
      { name: 'github__create_issue', tool: 'create_issue', contract: 'irreversible', idempotency_argument: null,
        contract_from: 'default', hinted: null, approve_every_use: false, arguments: ['title', 'requestId'] },
      { name: 'github__delete_repo', tool: 'delete_repo', contract: 'irreversible', idempotency_argument: null,
        contract_from: 'tools.toml', hinted: null, approve_every_use: true, arguments: ['repo'] },
    ],
  });

  it('shows each server with its state, secrets by name, and its tools with their contracts; restarts', async () => {
    let list = [server('crashed', 'the server\'s process ended')];
    const restartServer = vi.fn(async () => {
      list = [server('running', null)];
    });
    const ipc = { servers: vi.fn(async () => list), restartServer } as unknown as Ipc;
    render(Servers, { props: { ipc } });
    const card = await screen.findByTestId('server-github');
    expect(screen.getByTestId('server-state-github').textContent).toBe('crashed');
    expect(card.textContent).toContain("the server's process ended");
    expect(card.textContent).toContain('GITHUB_TOKEN');
    expect(card.textContent).toContain('github__create_issue');
    expect(card.textContent).toContain('irreversible');
    await fireEvent.click(screen.getByText('Restart'));
    expect(restartServer).toHaveBeenCalledWith('github');
    await waitFor(() => expect(screen.getByTestId('server-state-github').textContent).toBe('running'));
  });

  it('keeps an action\'s error in view after the list reloads', async () => {
    const restartServer = vi.fn(async () => {
      throw new Error('the server github cannot start: its secret GITHUB_TOKEN is not in the keychain');
    });
    const servers = vi.fn(async () => [server('crashed', null)]);
    render(Servers, { props: { ipc: { servers, restartServer } as unknown as Ipc } });
    await screen.findByTestId('server-github');
    await fireEvent.click(screen.getByText('Restart'));
    await waitFor(() => expect(servers).toHaveBeenCalledTimes(2));
    expect(screen.getByTestId('servers-error').textContent).toContain('GITHUB_TOKEN is not in the keychain');
  });

  it('lets the owner hold a tool to a contract, not where tools.toml decides, and choose when it starts', async () => {
    const setToolContract = vi.fn(async () => undefined);
    const setServerStart = vi.fn(async () => undefined);
    const ipc = { servers: vi.fn(async () => [server('running', null)]), setToolContract, setServerStart } as unknown as Ipc;
    render(Servers, { props: { ipc } });
    const pick = (await screen.findByTestId('contract-github__create_issue')) as HTMLSelectElement;
    await fireEvent.change(pick, { target: { value: 'idempotency_key' } });
    expect(setToolContract).toHaveBeenCalledWith('github', 'create_issue', {
      class: 'idempotency_key', idempotency_argument: 'title', approve_every_use: false,
    });
    await fireEvent.click(screen.getByTestId('every-use-github__search_issues'));
    expect(setToolContract).toHaveBeenCalledWith('github', 'search_issues', {
      class: null, idempotency_argument: null, approve_every_use: true,
    });
    // The server's hints are a suggestion the owner confirms; nothing else is offered for confirmation.
    expect(screen.getByTestId('contract-from-github__search_issues').textContent).toContain('not confirmed');
    expect(screen.queryByTestId('confirm-github__create_issue')).toBeNull();
    await fireEvent.click(screen.getByTestId('confirm-github__search_issues'));
    expect(setToolContract).toHaveBeenCalledWith('github', 'search_issues', {
      class: 'read_only', idempotency_argument: null, approve_every_use: false,
    });
    expect((screen.getByTestId('contract-github__delete_repo') as HTMLSelectElement).disabled).toBe(true);
    expect(screen.getByTestId('contract-from-github__delete_repo').textContent).toContain('tools.toml');
    await fireEvent.change(screen.getByTestId('server-start-github'), { target: { value: 'on_first_use' } });
    expect(setServerStart).toHaveBeenCalledWith('github', 'on_first_use');
  });

  it("shows where a remote server's OAuth sign-in stands, and nothing of the kind for others", async () => {
    const remote = { ...server('stopped', null), name: 'tracker', launched: 'https://mcp.example/mcp (OAuth)',
      sign_in: 'sign-in needed: run `postern servers login tracker`' };
    render(Servers, { props: { ipc: { servers: vi.fn(async () => [remote, server('running', null)]) } as unknown as Ipc } });
    expect((await screen.findByTestId('server-sign-in-tracker')).textContent).toContain('postern servers login tracker');
    expect(screen.queryByTestId('server-sign-in-github')).toBeNull();
  });

  it('signs a server in: shows the URL while it waits, then where the sign-in stands', async () => {
    let release: () => void = () => {};
    const waiting = new Promise<void>((r) => (release = r));
    const remote = { ...server('stopped', null), name: 'tracker', sign_in: 'not signed in' };
    const beginSignIn = vi.fn(async () => 'http://127.0.0.1:9/authorize?state=s');
    const finishSignIn = vi.fn(async () => {
      await waiting;
      return 'signed in (token until 2026-12-02T20:00:00Z, refreshed as needed)';
    });
    const ipc = { servers: vi.fn(async () => [remote]), beginSignIn, finishSignIn } as unknown as Ipc;
    render(Servers, { props: { ipc } });
    await fireEvent.click(await screen.findByTestId('sign-in-tracker'));
    const link = (await screen.findByTestId('sign-in-url-tracker')) as HTMLAnchorElement;
    expect(link.href).toContain('/authorize?state=s');
    expect(beginSignIn).toHaveBeenCalledWith('tracker');
    release();
    expect((await screen.findByTestId('servers-signed-in')).textContent).toContain('signed in');
    expect(screen.queryByTestId('sign-in-url-tracker')).toBeNull();
  });

  it('says how to bring servers in when there are none', async () => {
    render(Servers, { props: { ipc: { servers: vi.fn(async () => []) } as unknown as Ipc } });
    expect((await screen.findByTestId('servers-empty')).textContent).toContain('postern servers import');
  });
});

describe('Servers form', () => {
  it('adds a server with its secret typed into a password field', async () => {
    const addServer = vi.fn(async () => undefined);
    const ipc = { servers: vi.fn(async () => []), addServer } as unknown as Ipc;
    render(Servers, { props: { ipc } });
    await screen.findByTestId('servers-empty');
    await fireEvent.click(screen.getByTestId('add-server'));
    await fireEvent.input(screen.getByPlaceholderText('name (tools become name__tool)'), { target: { value: 'github' } });
    await fireEvent.input(screen.getByPlaceholderText(/^command/), { target: { value: 'npx -y @modelcontextprotocol/server-github' } });
    await fireEvent.click(screen.getByText('+ environment value'));
    await fireEvent.input(screen.getByPlaceholderText('VARIABLE'), { target: { value: 'GITHUB_TOKEN' } });
    const secret = screen.getByTestId('secret-0') as HTMLInputElement;
    expect(secret.type).toBe('password');
    await fireEvent.input(secret, { target: { value: 'ghp_canary' } });
    await fireEvent.submit(screen.getByTestId('server-form'));
    expect(addServer).toHaveBeenCalledWith({
      name: 'github', command: 'npx', args: ['-y', '@modelcontextprotocol/server-github'],
      env: [{ key: 'GITHUB_TOKEN', value: 'ghp_canary', secret: true }], approve_every_use: false,
      url: null, credential: null, oauth: false,
    });
  });

  it('offers OAuth for a remote server that asks for it, then adds it and signs it in', async () => {
    const addServer = vi.fn(async () => undefined);
    const probeServer = vi.fn(async () => ({
      oauth: true, issuer: 'https://auth.example', said: 'The server signs in with OAuth at https://auth.example.',
    }));
    const beginSignIn = vi.fn(async () => 'https://auth.example/authorize?state=s');
    const finishSignIn = vi.fn(async () => 'signed in');
    const ipc = { servers: vi.fn(async () => []), addServer, probeServer, beginSignIn, finishSignIn } as unknown as Ipc;
    render(Servers, { props: { ipc } });
    await screen.findByTestId('servers-empty');
    await fireEvent.click(screen.getByTestId('add-server'));
    await fireEvent.input(screen.getByPlaceholderText('name (tools become name__tool)'), { target: { value: 'tracker' } });
    await fireEvent.click(screen.getByTestId('server-remote-kind'));
    const url = screen.getByTestId('server-url');
    await fireEvent.input(url, { target: { value: 'https://mcp.example/mcp' } });
    await fireEvent.change(url);
    expect(probeServer).toHaveBeenCalledWith('https://mcp.example/mcp');
    expect((await screen.findByTestId('server-probe')).textContent).toContain('OAuth at https://auth.example');
    expect((screen.getByTestId('server-oauth') as HTMLInputElement).checked).toBe(true);
    expect(screen.getByTestId('server-add').textContent).toContain('Add and sign in');
    await fireEvent.submit(screen.getByTestId('server-form'));
    expect(addServer).toHaveBeenCalledWith({
      name: 'tracker', command: '', args: [], env: [], approve_every_use: false,
      url: 'https://mcp.example/mcp', credential: null, oauth: true,
    });
    await waitFor(() => expect(beginSignIn).toHaveBeenCalledWith('tracker'));
    expect((await screen.findByTestId('servers-signed-in')).textContent).toContain('signed in');
  });

  it('offers a vault credential when the server does not ask for a sign-in', async () => {
    const addServer = vi.fn(async () => undefined);
    const probeServer = vi.fn(async () => ({ oauth: false, issuer: null, said: 'The server did not ask for a sign-in.' }));
    const beginSignIn = vi.fn();
    const ipc = { servers: vi.fn(async () => []), addServer, probeServer, beginSignIn } as unknown as Ipc;
    render(Servers, { props: { ipc } });
    await screen.findByTestId('servers-empty');
    await fireEvent.click(screen.getByTestId('add-server'));
    await fireEvent.input(screen.getByPlaceholderText('name (tools become name__tool)'), { target: { value: 'docs' } });
    await fireEvent.click(screen.getByTestId('server-remote-kind'));
    const url = screen.getByTestId('server-url');
    await fireEvent.input(url, { target: { value: 'https://docs.example/mcp' } });
    await fireEvent.change(url);
    await screen.findByTestId('server-probe');
    expect(screen.queryByTestId('server-oauth')).toBeNull();
    await fireEvent.input(screen.getByTestId('server-credential'), { target: { value: 'docs-token' } });
    await fireEvent.submit(screen.getByTestId('server-form'));
    expect(addServer).toHaveBeenCalledWith({
      name: 'docs', command: '', args: [], env: [], approve_every_use: false,
      url: 'https://docs.example/mcp', credential: 'docs-token', oauth: false,
    });
    expect(beginSignIn).not.toHaveBeenCalled();
  });
});

describe('First run', () => {
  it('offers to move the agent configs\' servers and secrets into the keychain', async () => {
    const importApply = vi.fn(async () => 2);
    const ipc = {
      importOffer: vi.fn(async () => ({ servers: 2, secrets: 3, files: ['/home/u/.claude.json'] })),
      importApply,
    } as unknown as Ipc;
    render(Connect, { props: { ipc, dataDir: '/home/u/.local/share/postern' } });
    const offer = await screen.findByTestId('import-offer');
    expect(offer.textContent).toContain('2 MCP server(s) with 3 plaintext secret(s)');
    expect(offer.textContent).toContain('/home/u/.claude.json');
    await fireEvent.click(screen.getByTestId('import-apply'));
    expect(importApply).toHaveBeenCalled();
    expect((await screen.findByTestId('import-done')).textContent).toContain('Moved 2 MCP server(s)');
  });

  it('offers nothing when no config holds a server', async () => {
    const ipc = { importOffer: vi.fn(async () => ({ servers: 0, secrets: 0, files: [] })) } as unknown as Ipc;
    render(Connect, { props: { ipc, dataDir: '/d' } });
    await screen.findByTestId('first-run');
    expect(screen.queryByTestId('import-offer')).toBeNull();
  });
});

describe('Settings', () => {
  it('turns starting at login on and off', async () => {
    let on = false;
    const view = () => ({ autostart: on, autostart_path: '/home/u/.config/autostart/postern.desktop' });
    const setAutostart = vi.fn(async (value: boolean) => {
      on = value;
      return view();
    });
    render(Settings, { props: { ipc: { settings: vi.fn(async () => view()), setAutostart } as unknown as Ipc } });
    const box = (await screen.findByTestId('autostart')) as HTMLInputElement;
    expect(box.checked).toBe(false);
    await fireEvent.click(box);
    expect(setAutostart).toHaveBeenCalledWith(true);
    await waitFor(() => expect(screen.getByTestId('autostart-path').textContent).toContain('Started at login by'));
    await fireEvent.click(box);
    expect(setAutostart).toHaveBeenLastCalledWith(false);
  });

  it('shows how far behind the OpenTelemetry export is, and its last error', async () => {
    const exportStatus = vi.fn(async () => ({
      target: 'http://collector:4318/v1/traces', lag_rows: 12, last_sent: 1_764_445_000_000,
      last_error: 'traces: HTTP export failed: network error',
    }));
    const settings = vi.fn(async () => ({ autostart: false, autostart_path: '/a' }));
    render(Settings, { props: { ipc: { settings, exportStatus } as unknown as Ipc } });
    expect((await screen.findByTestId('export-status')).textContent).toContain('12 row(s) behind');
    expect(screen.getByTestId('export-error').textContent).toContain('network error');
  });
});
