import { fireEvent, render, screen, waitFor } from '@testing-library/svelte';
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
      { key: 'r', label: 'return the recorded result', needs_reason: false },
      { key: 'n', label: 'dispatch anew (give a reason)', needs_reason: true },
      { key: 'd', label: 'deny this retry', needs_reason: false },
    ],
    asked_at: Date.now(),
    deadline: Date.now() + 120_000,
  };
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
    render(ApprovalDialog, { props: { id: 'q1', ipc } });
    await screen.findByText('review a retry');
    expect(screen.getByText('completed_result_not_delivered')).toBeTruthy();
    expect(screen.getByText('the original completed')).toBeTruthy();
    expect(screen.getByTestId('dialog-timeline').textContent).toContain('2026-11-30T00:00:00.000Z');
    expect(screen.getByTestId('countdown').textContent).toMatch(/^1[12]\d s left$/);
  });

  it('answers with the keyboard shortcut', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc } });
    await screen.findByText('review a retry');
    await fireEvent.keyDown(window, { key: 'r' });
    await waitFor(() => expect(ipc.answerApproval).toHaveBeenCalledWith('q1', 'r', null));
  });

  it('asks for a reason before dispatching anew, and refuses a blank one', async () => {
    const ipc = fakeIpc(review());
    render(ApprovalDialog, { props: { id: 'q1', ipc } });
    await screen.findByText('review a retry');
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
    render(ApprovalDialog, { props: { id: 'q1', ipc } });
    await screen.findByText('review a retry');
    await fireEvent.keyDown(window, { key: 'c' });
    expect(ipc.answerApproval).not.toHaveBeenCalled();
  });

  it('says so when the question is no longer open', async () => {
    const ipc = { approval: vi.fn(async () => { throw new Error('this question is no longer open'); }) } as unknown as Ipc;
    render(ApprovalDialog, { props: { id: 'gone', ipc } });
    expect((await screen.findByTestId('dialog-error')).textContent).toContain('no longer open');
  });
});
