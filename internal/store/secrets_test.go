package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func sealAs(value string) Seal {
	return func(v int64) (string, error) { return fmt.Sprintf("sealed(%s,v%d)", value, v), nil }
}

func TestSecrets(t *testing.T) {
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			a, err := st.CreateSecret(ctx, Secret{ID: "sec_a", TeamID: "t1", Name: "token", Metadata: map[string]string{"k": "v"}}, sealAs("one"))
			if err != nil || a.CurrentVersion != 1 {
				t.Fatalf("create: %+v, %v", a, err)
			}
			if _, err := st.CreateSecret(ctx, Secret{ID: "sec_b", TeamID: "t1", Name: "token"}, sealAs("x")); !errors.Is(err, ErrConflict) {
				t.Errorf("a name taken in the team: %v", err)
			}
			// Another team may use the name, and sees nothing of t1's.
			if _, err := st.CreateSecret(ctx, Secret{ID: "sec_c", TeamID: "t2", Name: "token"}, sealAs("other")); err != nil {
				t.Fatal(err)
			}
			for _, ref := range []string{"sec_a", "token"} {
				if got, err := st.GetSecret(ctx, "t1", ref); err != nil || got.ID != "sec_a" || got.Metadata["k"] != "v" {
					t.Errorf("get %s: %+v, %v", ref, got, err)
				}
			}
			if _, err := st.GetSecret(ctx, "t2", "sec_a"); !errors.Is(err, ErrNotFound) {
				t.Errorf("another team's secret by ID: %v", err)
			}
			for _, team := range []string{"", "t3"} {
				if _, _, err := st.SecretValue(ctx, team, "token"); err == nil {
					t.Errorf("SecretValue for team %q succeeded", team)
				}
			}
			b, err := st.AddSecretVersion(ctx, "t1", "sec_a", sealAs("two"), nil)
			if err != nil || b.CurrentVersion != 2 || b.Metadata["k"] != "v" {
				t.Fatalf("new version: %+v, %v", b, err)
			}
			if _, err := st.AddSecretVersion(ctx, "t2", "sec_a", sealAs("x"), nil); !errors.Is(err, ErrNotFound) {
				t.Errorf("a new version of another team's secret: %v", err)
			}
			_, v, err := st.SecretValue(ctx, "t1", "token")
			if err != nil || v != "sealed(two,v2)" {
				t.Errorf("current value: %q, %v", v, err)
			}
			_, v, _ = st.SecretValue(ctx, "t2", "token")
			if v != "sealed(other,v1)" {
				t.Errorf("t2's value: %q", v)
			}
			for i := range 5 {
				if _, err := st.CreateSecret(ctx, Secret{ID: fmt.Sprintf("sec_p%d", i), TeamID: "t1", Name: fmt.Sprintf("p%d", i)}, sealAs("p")); err != nil {
					t.Fatal(err)
				}
			}
			var seen []string
			var after *SecretCursor
			for {
				page, err := st.ListSecrets(ctx, "t1", after, 2)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range page {
					seen = append(seen, s.Name)
				}
				if len(page) < 2 {
					break
				}
				last := page[len(page)-1]
				after = &SecretCursor{CreatedAt: last.CreatedAt, ID: last.ID}
			}
			if fmt.Sprint(seen) != "[token p0 p1 p2 p3 p4]" {
				t.Errorf("listed %v", seen)
			}
			if err := st.DeleteSecret(ctx, "t2", "sec_a"); !errors.Is(err, ErrNotFound) {
				t.Errorf("deleting another team's secret: %v", err)
			}
			if err := st.DeleteSecret(ctx, "t1", "sec_a"); err != nil {
				t.Fatal(err)
			}
			if _, _, err := st.SecretValue(ctx, "t1", "token"); !errors.Is(err, ErrNotFound) {
				t.Errorf("value of a deleted secret: %v", err)
			}
			if _, err := st.ListSecrets(ctx, "", nil, 0); err == nil {
				t.Error("listing without a team succeeded")
			}
		})
	}
}

// A team keeps at most MaxSecretsPerTeam secrets and each secret its last
// KeptSecretVersions versions: what a tenant stores is bounded.
func TestSecretLimits(t *testing.T) {
	for name, st := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			for i := range MaxSecretsPerTeam {
				if _, err := st.CreateSecret(ctx, Secret{ID: fmt.Sprintf("sec_l%04d", i), TeamID: "full", Name: fmt.Sprintf("l%d", i)}, sealAs("x")); err != nil {
					t.Fatalf("secret %d: %v", i, err)
				}
			}
			if _, err := st.CreateSecret(ctx, Secret{ID: "sec_over", TeamID: "full", Name: "over"}, sealAs("x")); !errors.Is(err, ErrSecretLimit) {
				t.Errorf("secret %d of a team: %v, want ErrSecretLimit", MaxSecretsPerTeam+1, err)
			}
			if _, err := st.CreateSecret(ctx, Secret{ID: "sec_other", TeamID: "other", Name: "over"}, sealAs("x")); err != nil {
				t.Errorf("another team is not limited by this one's count: %v", err)
			}
			for i := range KeptSecretVersions + 5 {
				if _, err := st.AddSecretVersion(ctx, "full", "sec_l0000", sealAs(fmt.Sprint(i)), nil); err != nil {
					t.Fatal(err)
				}
			}
			var kept, oldest int64
			db := st.(*SQL).db
			if err := db.QueryRowContext(ctx, st.(*SQL).q("SELECT COUNT(*), MIN(version) FROM secret_versions WHERE secret_id = ?"), "sec_l0000").Scan(&kept, &oldest); err != nil {
				t.Fatal(err)
			}
			if kept != KeptSecretVersions || oldest != KeptSecretVersions+6-KeptSecretVersions+1 {
				t.Errorf("kept %d versions from %d, want the last %d", kept, oldest, KeptSecretVersions)
			}
			if _, v, err := st.SecretValue(ctx, "full", "l0"); err != nil || v != fmt.Sprintf("sealed(%d,v%d)", KeptSecretVersions+4, KeptSecretVersions+6) {
				t.Errorf("current value: %q, %v", v, err)
			}
		})
	}
}
