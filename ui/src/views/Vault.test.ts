import { fireEvent, render, screen, waitFor } from '@testing-library/svelte';
import { describe, expect, it, vi } from 'vitest';
import Vault from './Vault.svelte';
import type { Ipc, NewCredential, VaultView } from '../lib/ipc';

const empty: VaultView = { locked: false, credentials: [], ssh_hosts: [] };

describe('Vault', () => {
  it('shows the empty state, then adds a credential without ever showing its secret', async () => {
    let view = empty;
    const addCredential = vi.fn(async (_credential: NewCredential) => {
      view = { ...empty, credentials: [{ name: 'pay', kind: 'bearer', hosts: ['api.example.com'], approve_every_use: true }] };
    });
    const ipc = { vault: vi.fn(async () => view), addCredential } as unknown as Ipc;
    render(Vault, { props: { ipc } });
    expect(await screen.findByTestId('vault-empty')).toBeTruthy();
    await fireEvent.click(screen.getByTestId('add-credential'));
    await fireEvent.input(screen.getByPlaceholderText('name'), { target: { value: 'pay' } });
    await fireEvent.input(screen.getByPlaceholderText(/hosts it may be sent to/), { target: { value: 'api.example.com' } });
    const secret = screen.getByTestId('secret') as HTMLInputElement;
    expect(secret.type).toBe('password');
    await fireEvent.input(secret, { target: { value: 'CANARY-ui-secret' } });
    await fireEvent.submit(secret.closest('form')!);
    await waitFor(() => expect(addCredential).toHaveBeenCalled());
    expect(addCredential.mock.calls[0][0]).toMatchObject({ name: 'pay', hosts: ['api.example.com'], secret: 'CANARY-ui-secret' });
    expect(await screen.findByTestId('credentials')).toBeTruthy();
    expect(document.body.innerHTML).not.toContain('CANARY-ui-secret');
  });

  it('turns approve-every-use off for a credential', async () => {
    let view: VaultView = { ...empty, credentials: [{ name: 'pay', kind: 'bearer', hosts: ['h'], approve_every_use: true }] };
    const setApproveEveryUse = vi.fn(async (name: string, on: boolean) => {
      view = { ...view, credentials: [{ ...view.credentials[0], approve_every_use: on }] };
    });
    render(Vault, { props: { ipc: { vault: vi.fn(async () => view), setApproveEveryUse } as unknown as Ipc } });
    await screen.findByTestId('credentials');
    const box = document.querySelector('[data-every-use=pay]') as HTMLInputElement;
    expect(box.checked).toBe(true);
    await fireEvent.click(box);
    expect(setApproveEveryUse).toHaveBeenCalledWith('pay', false);
    await waitFor(() => expect((document.querySelector('[data-every-use=pay]') as HTMLInputElement).checked).toBe(false));
  });

  it('clears the secret field when the vault refuses it', async () => {
    const ipc = {
      vault: vi.fn(async () => empty),
      addCredential: vi.fn(async () => { throw new Error('"bad name" must be 1–64 characters'); }),
    } as unknown as Ipc;
    render(Vault, { props: { ipc } });
    await screen.findByTestId('vault-empty');
    await fireEvent.click(screen.getByTestId('add-credential'));
    await fireEvent.input(screen.getByPlaceholderText('name'), { target: { value: 'bad name' } });
    await fireEvent.input(screen.getByPlaceholderText(/hosts/), { target: { value: 'h' } });
    const secret = screen.getByTestId('secret') as HTMLInputElement;
    await fireEvent.input(secret, { target: { value: 'CANARY-2' } });
    await fireEvent.submit(secret.closest('form')!);
    expect((await screen.findByTestId('vault-error')).textContent).toContain('must be 1–64 characters');
    expect(secret.value).toBe('');
  });
});
