import { cleanup, fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { describe, expect, it, vi } from 'vitest';
import ApprovalDialog from './ApprovalDialog.svelte';
import type { ApprovalView, Ipc } from '../lib/ipc';

function review(): ApprovalView {
  return {
    id: 'q1',
    kind: 'retry_review',
    execution_id: 'act_01JB8K8Z7Q7W6T2J0N5RZ1X2Y3',
    title: 'review a retry',
    intro: 'The agent repeated a call that matches execution act_01JB8K8Z7Q7W6T2J0N5RZ1X2Y3 on record.',
    rows: [
      ['original', 'act_01JB8K8Z7Q7W6T2J0N5RZ1X2Y3 (tool wire, replay contract irreversible)'],
      ['state', 'completed_result_not_delivered'],
      ['not re-sent', 'the original completed'],
    ],
    timeline: [{ at: Date.UTC(2026, 10, 30), event: 'dispatched', summary: 'POST http://127.0.0.1/pay' }],
    choices: [
      { key: 'r', label: 'return the recorded result', needs_reason: false, needs_confirmation: false },
      { key: 'n', label: 'dispatch anew (give a reason)', needs_reason: true, needs_confirmation: false },
      { key: 'd', label: 'deny this retry', needs_reason: false, needs_confirmation: false },
    ],
    details: null,
    asked_at: Date.now(),
    deadline: Date.now() + 120_000,
  };
}

function session(): ApprovalView {
  return {
    ...review(),
    kind: 'session_authorization',
    title: 'authorize an agent run',
    timeline: [],
    choices: [
      { key: 's', label: 'allow this session', needs_reason: false, needs_confirmation: false },
      { key: 'a', label: 'always allow this agent (this executable hash)', needs_reason: false, needs_confirmation: true },
      { key: 'd', label: 'deny', needs_reason: false, needs_confirmation: false },
    ],
  };
}

// jsdom's events are synthetic (isTrusted is false): the tests stand in for the window system.
const real = () => true;

async function armed() {
  await waitFor(() => expect(screen.getByTestId('armed').dataset.armed).toBe('true'));
}

function fakeIpc(view: ApprovalView) {
  return {
    approval: vi.fn(async () => view),
    answerApproval: vi.fn(async () => undefined),
  } as unknown as Ipc & { answerApproval: ReturnType<typeof vi.fn> };
}

describe('ApprovalDialog', () => {
  it('shows the original record, the timeline and a countdown', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 50, trusted: real } });
    await screen.findByText('review a retry');
    expect(screen.getByText('completed_result_not_delivered')).toBeTruthy();
    expect(screen.getByText('the original completed')).toBeTruthy();
    expect(screen.getByTestId('dialog-timeline').textContent).toContain('2026-11-30T00:00:00.000Z');
    expect(screen.getByTestId('countdown').textContent).toMatch(/^1[12]\d s left$/);
  });

  it('answers with the keyboard shortcut', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 50, trusted: real } });
    await screen.findByText('review a retry');
    await armed();
    await fireEvent.keyDown(window, { key: 'r' });
    await waitFor(() => expect(ipc.answerApproval).toHaveBeenCalledWith('q1', 'r', null));
  });

  it('asks for a reason before dispatching anew, and refuses a blank one', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 50, trusted: real } });
    await screen.findByText('review a retry');
    await armed();
    await fireEvent.keyDown(window, { key: 'n' });
    const input = (await screen.findByTestId('reason')) as HTMLInputElement;
    await fireEvent.click(screen.getByText('dispatch anew (give a reason)', { exact: false }));
    expect(screen.getByTestId('dialog-error').textContent).toContain('reason is required');
    expect(ipc.answerApproval).not.toHaveBeenCalled();
    await fireEvent.input(input, { target: { value: 'the bank confirmed it bounced' } });
    await fireEvent.keyDown(input, { key: 'Enter' });
    await waitFor(() =>
      expect(ipc.answerApproval).toHaveBeenCalledWith('q1', 'n', 'the bank confirmed it bounced'),
    );
  });

  it('ignores keys that are not offered', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 50, trusted: real } });
    await screen.findByText('review a retry');
    await armed();
    await fireEvent.keyDown(window, { key: 'c' });
    expect(ipc.answerApproval).not.toHaveBeenCalled();
  });

  it('says so when the question is no longer open', async () => {
    const ipc = { approval: vi.fn(async () => { throw new Error('this question is no longer open'); }) } as unknown as Ipc;
    render(ApprovalDialog, { props: { id: 'gone', ipc } });
    expect((await screen.findByTestId('dialog-error')).textContent).toContain('no longer open');
  });

  it('takes no answer from keys typed before it is armed, from auto-repeat or from untrusted events', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 300, trusted: real } });
    await screen.findByText('review a retry');
    await fireEvent.keyDown(window, { key: 'r' });
    expect(screen.getByTestId('armed').dataset.armed).toBe('false');
    expect(screen.getByTestId('armed').dataset.ignored).toBe('1');
    await armed();
    await fireEvent.keyDown(window, { key: 'r', repeat: true });
    expect(ipc.answerApproval).not.toHaveBeenCalled();
    cleanup();
    const strict = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc: strict, armMs: 10 } });
    await screen.findByText('review a retry');
    await new Promise((r) => setTimeout(r, 50));
    await fireEvent.keyDown(window, { key: 'r' });
    await fireEvent.click(screen.getByText('return the recorded result', { exact: false }));
    expect(strict.answerApproval).not.toHaveBeenCalled();
  });

  it('asks for a deliberate second step before a permanent answer', async () => {
    const ipc = fakeIpc(session());
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 10, trusted: real } });
    await screen.findByText('authorize an agent run');
    await armed();
    await fireEvent.keyDown(window, { key: 'a' });
    await screen.findByTestId('confirm');
    await fireEvent.keyDown(window, { key: 'a' });
    await fireEvent.keyDown(window, { key: 'Enter' });
    expect(ipc.answerApproval).not.toHaveBeenCalled();
    await fireEvent.click(screen.getByTestId('confirm-permanent'));
    await waitFor(() => expect(ipc.answerApproval).toHaveBeenCalledWith('q1', 'a', null));
  });

  it('shows the whole body when the reviewer expands it', async () => {
    const ipc = fakeIpc({ ...review(), details: 'the whole body, including the tail' });
    render(ApprovalDialog, { props: { id: 'q1', ipc, armMs: 10, trusted: real } });
    await screen.findByText('review a retry');
    expect(screen.queryByTestId('details')).toBeNull();
    await fireEvent.click(screen.getByTestId('expand'));
    expect(screen.getByTestId('details').textContent).toContain('including the tail');
  });
});
