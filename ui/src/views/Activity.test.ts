import { fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { describe, expect, it, vi } from 'vitest';
import Activity from './Activity.svelte';
import type { ExecutionFilter, ExecutionRow, Ipc } from '../lib/ipc';

const onJournalChanged = async () => () => {};

function rows(n: number, from = 0): ExecutionRow[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `act_${String(1_000_000 - from - i).padStart(26, '0')}`,
    tool: i % 2 ? 'pay' : 'wire',
    state: i % 3 ? 'completed' : 'outcome_unknown',
    actor: 'process:/usr/bin/agent@sha256:ab',
    session: null,
    channel: 'http',
    contract: 'irreversible',
    accepted_at: Date.UTC(2026, 10, 30) - i,
    updated_at: Date.UTC(2026, 10, 30) - i,
  }));
}

describe('Activity', () => {
  it('says how to connect an agent when nothing has happened yet, and that filters match nothing', async () => {
    const ipc = { executions: vi.fn(async () => []), onJournalChanged } as unknown as Ipc;
    render(Activity, { props: { ipc } });
    expect((await screen.findByTestId('activity-empty')).textContent).toContain('claude mcp add postern -- postern mcp');
    expect(screen.getByTestId('copy-connect')).toBeTruthy();
    await fireEvent.input(screen.getByTestId('search'), { target: { value: 'wire' } });
    await fireEvent.submit(screen.getByTestId('search').closest('form')!);
    await waitFor(() => expect(screen.getByTestId('activity-empty').textContent).toContain('No executions match'));
  });

  it('shows each state as a badge of its group, with a legend, and the lifecycle with uncertain steps apart', async () => {
    const executionDetail = vi.fn(async () => ({
      row: rows(1)[0], fingerprint: 'hmac-sha256:ab', idempotency_key: null, target: 'POST http://127.0.0.1/pay',
      target_outcome: null, calls: [], related: [], result: null,
      timeline: [
        { at: 1, event: 'accepted', summary: '' },
        { at: 2, event: 'authorized', summary: '' },
        { at: 3, event: 'dispatched', summary: '' },
        { at: 4, event: 'outcome_unknown', summary: '' },
      ],
    }));
    const ipc = { executions: vi.fn(async () => rows(3)), executionDetail, onJournalChanged } as unknown as Ipc;
    render(Activity, { props: { ipc } });
    await screen.findByTestId('activity');
    const groups = [...document.querySelectorAll('[data-testid=state] [data-group]')].map((b) => b.getAttribute('data-group'));
    expect(groups).toEqual(['uncertain', 'done', 'done']);
    expect(screen.getByTestId('legend').textContent).toContain('needs a look: outcome unknown');
    await fireEvent.click(document.querySelector('[data-execution]')!);
    const steps = [...(await screen.findByTestId('timeline')).querySelectorAll('li')];
    expect(steps.map((s) => [s.getAttribute('data-event'), s.classList[0]])).toEqual([
      ['accepted', 'progress'], ['authorized', 'progress'], ['dispatched', 'progress'], ['outcome_unknown', 'uncertain'],
    ]);
  });

  it('pages by the last execution ID and filters by state', async () => {
    const executions = vi.fn(async (f: ExecutionFilter) => (f.before ? rows(10, 100) : rows(100)));
    const ipc = { executions, onJournalChanged } as unknown as Ipc;
    render(Activity, { props: { ipc } });
    await screen.findByTestId('activity');
    expect(screen.getByTestId('loaded-count').textContent).toBe('100');
    // Only the rows in view are drawn, however many are loaded.
    expect(document.querySelectorAll('[data-execution]').length).toBeLessThan(100);
    await fireEvent.click(screen.getByTestId('older'));
    await waitFor(() => expect(screen.getByTestId('loaded-count').textContent).toBe('110'));
    expect(executions.mock.calls[1][0].before).toBe(rows(100)[99].id);
    expect(screen.queryByTestId('older')).toBeNull();

    await fireEvent.change(screen.getByTestId('state-filter'), { target: { value: 'outcome_unknown' } });
    await fireEvent.submit(screen.getByTestId('search').closest('form')!);
    await waitFor(() => expect(executions.mock.calls.at(-1)![0].state).toBe('outcome_unknown'));
    expect(executions.mock.calls.at(-1)![0].before).toBeNull();
  });

  it('sends a time range as milliseconds', async () => {
    const executions = vi.fn(async (_f: ExecutionFilter) => rows(3));
    render(Activity, { props: { ipc: { executions, onJournalChanged } as unknown as Ipc } });
    await screen.findByTestId('activity');
    await fireEvent.input(screen.getByTestId('from'), { target: { value: '2026-11-30T00:00' } });
    await fireEvent.submit(screen.getByTestId('search').closest('form')!);
    await waitFor(() => expect(executions.mock.calls.at(-1)![0].from).toBe(new Date('2026-11-30T00:00').getTime()));
    expect(executions.mock.calls.at(-1)![0].until).toBeNull();
  });

  it('shows an error state with the message', async () => {
    const ipc = { executions: vi.fn(async () => { throw new Error('the journal is unavailable'); }), onJournalChanged } as unknown as Ipc;
    render(Activity, { props: { ipc } });
    expect((await screen.findByTestId('activity-error')).textContent).toContain('journal is unavailable');
  });

  it('reloads the first page when the journal grows, and stops listening when it is closed', async () => {
    let changed: ((size: number) => void) | null = null;
    const unlisten = vi.fn();
    const listen = vi.fn(async (f: (size: number) => void) => { changed = f; return unlisten; });
    let journal = rows(2);
    const executions = vi.fn(async () => journal);
    const view = render(Activity, { props: { ipc: { executions, onJournalChanged: listen } as unknown as Ipc } });
    await waitFor(() => expect(document.querySelectorAll('[data-execution]').length).toBe(2));
    journal = rows(3);
    changed!(42);
    await waitFor(() => expect(document.querySelectorAll('[data-execution]').length).toBe(3));
    expect(executions).toHaveBeenCalledTimes(2);
    view.unmount();
    await waitFor(() => expect(unlisten).toHaveBeenCalled());
  });
});
