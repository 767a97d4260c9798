// Typed calls into the app. The argument and result types are generated from the Rust types
// (src-tauri/src/ipc.rs, by ts-rs) into ./bindings; every error is an IpcError {code, message}.
import { invoke } from '@tauri-apps/api/core';
import { listen, type UnlistenFn } from '@tauri-apps/api/event';
import type { ApprovalView } from './bindings/ApprovalView';
import type { ExecutionDetail } from './bindings/ExecutionDetail';
import type { ExecutionFilter } from './bindings/ExecutionFilter';
import type { ExecutionRow } from './bindings/ExecutionRow';
import type { IpcError } from './bindings/IpcError';
import type { SessionRow } from './bindings/SessionRow';
import type { StatusView } from './bindings/StatusView';
import type { ToolsView } from './bindings/ToolsView';
import type { VaultView } from './bindings/VaultView';
import type { NewCredential } from './bindings/NewCredential';
import type { NewSshHost } from './bindings/NewSshHost';
import type { AuditView } from './bindings/AuditView';
import type { ServerRow } from './bindings/ServerRow';
import type { NewServer } from './bindings/NewServer';
import type { ServerProbe } from './bindings/ServerProbe';
import type { EnvValue } from './bindings/EnvValue';
import type { ImportOffer } from './bindings/ImportOffer';
import type { UpstreamToolRow } from './bindings/UpstreamToolRow';
import type { ToolContractInput } from './bindings/ToolContractInput';
import type { SettingsView } from './bindings/SettingsView';
import type { ExportView } from './bindings/ExportView';

export type {
  ApprovalView, AuditView, EnvValue, ExecutionDetail, ExportView, ImportOffer, ExecutionFilter, ExecutionRow, IpcError, NewCredential, NewServer, NewSshHost, ServerProbe, ServerRow,
  SessionRow, SettingsView, StatusView, ToolContractInput, ToolsView, UpstreamToolRow, VaultView,
};

/** A failed command: the app's error code and message. */
export class IpcFailure extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

async function call<T>(command: string, args?: Record<string, unknown>): Promise<T> {
  try {
    return await invoke<T>(command, args);
  } catch (e) {
    const err = e as Partial<IpcError>;
    throw new IpcFailure(err?.code ?? 'ipc_failed', err?.message ?? String(e));
  }
}

export const ipc = {
  pendingApprovals: () => call<ApprovalView[]>('pending_approvals'),
  approval: (id: string) => call<ApprovalView>('approval', { id }),
  answerApproval: (id: string, key: string, reason: string | null) =>
    call<void>('answer_approval', { id, key, reason }),
  openApproval: (id: string) => call<void>('open_approval', { id }),
  executions: (filter: ExecutionFilter) => call<ExecutionRow[]>('executions', { filter }),
  executionDetail: (id: string) => call<ExecutionDetail>('execution_detail', { id }),
  sessions: () => call<SessionRow[]>('sessions'),
  revokeSession: (id: string) => call<void>('revoke_session', { id }),
  lockVault: () => call<void>('lock_vault'),
  unlockVault: () => call<void>('unlock_vault'),
  status: () => call<StatusView>('status'),
  tools: () => call<ToolsView>('tools'),
  servers: () => call<ServerRow[]>('servers'),
  restartServer: (name: string) => call<void>('restart_server', { name }),
  addServer: (server: NewServer) => call<void>('add_server', { server }),
  probeServer: (url: string) => call<ServerProbe>('probe_server', { url }),
  removeServer: (name: string) => call<void>('remove_server', { name }),
  setToolContract: (server: string, tool: string, contract: ToolContractInput | null) =>
    call<void>('set_tool_contract', { server, tool, contract }),
  setServerStart: (name: string, start: string) => call<void>('set_server_start', { name, start }),
  beginSignIn: (name: string) => call<string>('begin_sign_in', { name }),
  finishSignIn: (name: string) => call<string>('finish_sign_in', { name }),
  settings: () => call<SettingsView>('settings'),
  setAutostart: (on: boolean) => call<SettingsView>('set_autostart', { on }),
  exportStatus: () => call<ExportView>('export_status'),
  importOffer: () => call<ImportOffer>('import_offer'),
  importApply: () => call<number>('import_apply'),
  vault: () => call<VaultView>('vault'),
  addCredential: (credential: NewCredential) => call<void>('add_credential', { credential }),
  addSshHost: (host: NewSshHost) => call<void>('add_ssh_host', { host }),
  removeCredential: (name: string) => call<void>('remove_credential', { name }),
  setApproveEveryUse: (name: string, on: boolean) => call<void>('set_approve_every_use', { name, on }),
  auditVerify: () => call<AuditView>('audit_verify'),
  auditCheckpoint: () => call<string>('audit_checkpoint'),
  onAuditProgress: (f: (done: number, total: number) => void): Promise<UnlistenFn> =>
    listen<[number, number]>('audit-progress', (e) => f(e.payload[0], e.payload[1])),
  onApprovalsChanged: (f: () => void): Promise<UnlistenFn> => listen('approvals-changed', () => f()),
  /** The journal grew (at most every 250 ms, with its size): a live view reloads. */
  onJournalChanged: (f: (size: number) => void): Promise<UnlistenFn> =>
    listen<number>('journal-changed', (e) => f(e.payload)),
};

export type Ipc = typeof ipc;

/** The message of an error from a command (or anything thrown). */
export function messageOf(e: unknown): string {
  return e instanceof IpcFailure ? e.message : e instanceof Error ? e.message : String(e);
}

/** RFC 3339 in UTC with milliseconds, as the CLI and the terminal approver print times. */
export function when(ms: number): string {
  return new Date(ms).toISOString();
}
